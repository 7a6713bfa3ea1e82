"""A stage's option ``quantization`` in a pipeline file, and the server flag --quantization
(omni/config/quantization.py): which stages take it, and the errors that name the stage or
the pipeline before any engine starts."""

from __future__ import annotations

import argparse

import pytest

from omni.config.pipeline import ConfigError, parse_pipeline
from omni.config.presets import load_pipeline
from omni.config.quantization import quantization_method, with_quantization
from omni.engines.base import EngineLoadError
from omni.engines.quantization import checked_choice
from omni.runtime.metrics import Metrics
from omni.server import parse_args, served_models


def _pipeline(llm_options=None, voc_options=None, painter_options=None):
    return parse_pipeline({
        "name": "talk",
        "stages": [
            {"name": "llm", "engine": "ar", "model_dir": "/models/llm", "final_output": "text",
             "options": llm_options or {}},
            {"name": "painter", "engine": "diffusion", "model": "qwen_image",
             "model_dir": "/models/image", "final_output": "image",
             "options": painter_options or {}},
            {"name": "voc", "engine": "generation", "model": "vits",
             "model_dir": "/models/vits", "final_output": "audio", "options": voc_options or {}}],
        "edges": [{"from": "llm", "to": "voc"}],
        "views": {"chat": {"stages": ["llm"]}, "speak": {"stages": ["voc"]}}})


ECHO = {"name": "echo", "stages": [{"name": "only", "engine": "echo", "final_output": "text"}]}


def _options(pipeline):
    return {s.name: dict(s.options) for s in pipeline.stages}


def test_a_pipeline_file_sets_it_per_stage():
    both = _options(_pipeline({"quantization": "fp8"}, painter_options={"quantization": "fp8"}))
    assert both["llm"] == both["painter"] == {"quantization": "fp8"} and both["voc"] == {}
    with pytest.raises(ConfigError, match=r"stages\[2\]\.options\.quantization: stage 'voc' is "
                                          r"a generation stage, which cannot store its weights "
                                          r"in fp8\. Only ar and diffusion stages can"):
        _pipeline(voc_options={"quantization": "fp8"})
    assert _options(_pipeline(voc_options={"quantization": "none"}))["voc"] == {
        "quantization": "none"}  # none asks nothing of it
    with pytest.raises(ConfigError, match=r"stages\[0\]\.options\.quantization: unknown method "
                                          r"'int4' on stage 'llm'\. Use one of none, fp8"):
        _pipeline({"quantization": "int4"})


def test_null_in_a_pipeline_file_is_none(tmp_path):
    """``quantization: null`` (YAML's empty value) is none, the default: on a stage that can
    take a method and on one that cannot; the engine reads it the same way, through the same
    check, which refuses what is no method on either side."""
    path = tmp_path / "talk.yaml"
    path.write_text("name: talk\nstages:\n"
                    "  - {name: llm, engine: ar, model_dir: /models/llm, final_output: text,\n"
                    "     options: {quantization: null}}\n"
                    "  - {name: voc, engine: generation, model: vits, model_dir: /models/vits,\n"
                    "     final_output: audio, options: {quantization: }}\n"
                    "edges: [{from: llm, to: voc}]\n")
    assert _options(load_pipeline(str(path))) == {"llm": {"quantization": None},
                                                  "voc": {"quantization": None}}
    assert [quantization_method(v) for v in (None, "none", "fp8")] == [None, None, "fp8"]
    assert checked_choice(None) is None and checked_choice("fp8") == "fp8"
    for bad in ("int4", 8, True, ["fp8"]):
        with pytest.raises(ValueError, match="must be one of none, fp8"):
            quantization_method(bad)
        with pytest.raises(EngineLoadError, match="option quantization must be one of none"):
            checked_choice(bad)
        with pytest.raises(ConfigError, match=r"stages\[0\]\.options\.quantization: unknown"):
            _pipeline({"quantization": bad})


def test_the_flag_applies_to_every_stage_that_can_take_it():
    pipeline, echo = with_quantization([_pipeline(), parse_pipeline(ECHO)], "fp8")
    assert echo == parse_pipeline(ECHO)  # a pipeline of none beside: left as it was
    assert _options(pipeline) == {"llm": {"quantization": "fp8"},
                                  "painter": {"quantization": "fp8"}, "voc": {}}
    assert _options(pipeline.views["chat"]) == {"llm": {"quantization": "fp8"}}
    assert _options(pipeline.views["speak"]) == {"voc": {}}  # a view of none: no error
    # the flag wins over the file's own choice, both ways
    (off,) = with_quantization([_pipeline({"quantization": "fp8"})], "none")
    assert _options(off)["llm"] == {"quantization": "none"}


def test_the_flag_on_a_pipeline_that_cannot_take_it_fails_naming_it():
    args = parse_args(["--pipeline", "echo", "--quantization", "fp8"])
    with pytest.raises(ConfigError, match=r"--quantization: no stage of the served pipelines "
                                          r"\(echo\) can store its weights in fp8 \(their "
                                          r"stages: .*\(echo\)"):
        served_models(args, Metrics())
    with pytest.raises(SystemExit):  # argparse: invalid choice, exit 2
        parse_args(["--quantization", "int4"])


def test_help_explains_the_flag(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--quantization {none,fp8}" in text
    assert "float8 e4m3" in text and "diffusion" in text and "/v1/models" in text
    assert isinstance(parse_args([]), argparse.Namespace) and parse_args([]).quantization is None
