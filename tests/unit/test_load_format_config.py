"""A stage's option ``load_format`` in a pipeline file, and the server flag --load-format
(omni/config/load_format.py): which stages take it, the errors that name the stage or the
pipeline before any engine starts, and what READY says of a stage running random weights."""

from __future__ import annotations

import pytest

from omni.config.load_format import with_load_format
from omni.config.memory import memory_note
from omni.config.pipeline import ConfigError, parse_pipeline
from omni.runtime.metrics import Metrics
from omni.server import parse_args, served_models


def _pipeline(painter_options=None, voc_options=None):
    return parse_pipeline({
        "name": "studio",
        "stages": [
            {"name": "painter", "engine": "diffusion", "model": "qwen_image",
             "model_dir": "/models/image", "final_output": "image",
             "options": painter_options or {}},
            {"name": "voc", "engine": "generation", "model": "vits",
             "model_dir": "/models/vits", "final_output": "audio", "options": voc_options or {}}],
        "views": {"paint": {"stages": ["painter"]}, "speak": {"stages": ["voc"]}}})


ECHO = {"name": "echo", "stages": [{"name": "only", "engine": "echo", "final_output": "text"}]}


def _options(pipeline):
    return {s.name: dict(s.options) for s in pipeline.stages}


def test_a_pipeline_file_sets_it_on_ar_and_diffusion_stages_only():
    assert _options(_pipeline({"load_format": "dummy"}))["painter"] == {"load_format": "dummy"}
    assert _options(_pipeline({"load_format": None}))["painter"] == {"load_format": None}
    with pytest.raises(ConfigError, match=r"stages\[1\]\.options\.load_format: stage 'voc' is "
                                          r"a generation stage, which takes no load_format\. "
                                          r"Only ar and diffusion stages do"):
        _pipeline(voc_options={"load_format": "dummy"})
    with pytest.raises(ConfigError, match=r"stages\[0\]\.options\.load_format: unknown load "
                                          r"format 'random' on stage 'painter'\. Use one of "
                                          r"auto, dummy"):
        _pipeline({"load_format": "random"})


def test_the_flag_applies_to_every_stage_that_can_take_it():
    pipeline, echo = with_load_format([_pipeline(), parse_pipeline(ECHO)], "dummy")
    assert echo == parse_pipeline(ECHO)  # a pipeline of none beside: left as it was
    assert _options(pipeline) == {"painter": {"load_format": "dummy"}, "voc": {}}
    assert _options(pipeline.views["paint"]) == {"painter": {"load_format": "dummy"}}
    assert _options(pipeline.views["speak"]) == {"voc": {}}
    # the flag wins over the file's own choice, both ways; auto asks nothing of a server
    # that has no diffusion stage
    (real,) = with_load_format([_pipeline({"load_format": "dummy"})], "auto")
    assert _options(real)["painter"] == {"load_format": "auto"}
    assert with_load_format([parse_pipeline(ECHO)], "auto") == [parse_pipeline(ECHO)]


def test_the_flag_on_a_server_with_no_diffusion_stage_fails_naming_it():
    args = parse_args(["--pipeline", "echo", "--load-format", "dummy"])
    with pytest.raises(ConfigError, match=r"--load-format: no stage of the served pipelines "
                                          r"\(echo\) can load dummy weights \(their stages: "
                                          r".*\(echo\)\)\. Only ar and diffusion stages can"):
        served_models(args, Metrics())
    with pytest.raises(SystemExit):  # argparse: invalid choice, exit 2
        parse_args(["--load-format", "random"])
    assert parse_args([]).load_format is None  # default: as each pipeline says


def test_help_explains_the_flag(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--load-format {auto,dummy}" in text
    assert "random weights" in text and "noise" in text
    assert "(ar and diffusion stages; on ar, plain causal LMs only" in text


def test_ready_says_the_weights_are_random():
    assert "RANDOM weights (load_format dummy)" in memory_note({"load_format": "dummy"})
    assert memory_note({}) == ""
