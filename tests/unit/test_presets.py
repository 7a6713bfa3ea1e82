"""Picking the built-in pipeline for a model directory, and naming the served model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni.config.pipeline import ConfigError
from omni.config.presets import load_pipeline, preset_path
from omni.runtime.metrics import Metrics
from omni.server import parse_args, served_models


def _model_dir(tmp_path, model_type: str):
    d = tmp_path / "My-Model-7B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": model_type}))
    return d


def test_model_dir_is_served_under_its_name_or_the_given_one(tmp_path):
    d = _model_dir(tmp_path, "qwen3")
    assert load_pipeline(d).name == "My-Model-7B"
    renamed = load_pipeline(d, "mine")
    assert renamed.name == "mine"
    assert all(s.model_dir == str(d.resolve()) for s in renamed.stages)


def test_unknown_model_type_names_the_supported_ones(tmp_path):
    with pytest.raises(ConfigError, match="qwen3"):
        load_pipeline(_model_dir(tmp_path, "nonesuch"))


def test_unknown_preset_and_non_model_dir_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="no built-in pipeline 'nonesuch'.*echo"):
        load_pipeline("nonesuch")
    with pytest.raises(ConfigError, match="not a model directory"):
        load_pipeline(tmp_path)


def test_qwen3_omni_release_gets_the_three_stage_pipeline(tmp_path):
    pipeline = load_pipeline(_model_dir(tmp_path, "qwen3_omni_moe"))
    assert pipeline.modalities == ("text", "audio") and pipeline.default_modalities == ("text",)
    assert [(s.name, s.engine) for s in pipeline.stages] == [
        ("thinker", "ar"), ("talker", "ar"), ("code2wav", "generation")]
    assert {(e.src, e.dst, e.delivery, e.max_lead) for e in pipeline.edges} == {
        ("thinker", "talker", "stream", 8), ("talker", "code2wav", "stream", None)}
    assert pipeline.route(["text"]).stages == ("thinker",)  # text-only: the thinker alone
    assert pipeline.route(["text", "audio"]).stages == ("thinker", "talker", "code2wav")


def test_qwen2_5_omni_release_gets_thinker_talker_token2wav(tmp_path):
    pipeline = load_pipeline(_model_dir(tmp_path, "qwen2_5_omni"))
    assert [(s.name, s.engine, s.model) for s in pipeline.stages] == [
        ("thinker", "ar", None), ("talker", "ar", "qwen2_5_omni_talker"),
        ("token2wav", "generation", "qwen2_5_omni_token2wav")]
    assert {(e.src, e.dst, e.delivery) for e in pipeline.edges} == {
        ("thinker", "talker", "stream"), ("talker", "token2wav", "stream")}
    assert pipeline.route(["text"]).stages == ("thinker",)


@pytest.mark.parametrize("tts_type", ["custom_voice", "base"])
def test_a_qwen3_tts_release_gets_the_ar_talker_and_code2wav(tmp_path, tts_type, preset_envs):
    """CustomVoice and Base (voice cloning) alike: the talker on the AR engine -> Code2Wav,
    both in the qwen3-tts environment."""
    stages = [("talker", "ar", "qwen3_tts_ar_talker"),
              ("code2wav", "generation", "qwen3_tts_code2wav")]
    d = tmp_path / "Qwen3-TTS"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3_tts",
                                               "tts_model_type": tts_type}))
    pipeline = load_pipeline(d)
    assert [(s.name, s.engine, s.model) for s in pipeline.stages] == stages
    assert all("qwen3-tts" in str(s.python) and s.model_dir == str(d.resolve())
               for s in pipeline.stages)
    assert pipeline.modalities == ("audio",)



def test_bench_qwen3_tts_streams_chunks_as_each_layouts_preset(preset_envs):
    """bench qwen3_tts's default chunk_frames is read from the layouts themselves: the AR
    preset's code2wav option (read here from the file) and the one-stage runner's default."""
    import yaml

    from bench.qwen3_tts import preset_chunk_frames
    from omni.models.qwen3_tts import DEFAULT_CHUNK_FRAMES

    raw = yaml.safe_load(preset_path("qwen3_tts_ar").read_text())
    code2wav = next(s for s in raw["stages"] if s["name"] == "code2wav")
    assert preset_chunk_frames("ar") == code2wav["options"]["chunk_frames"]
    assert preset_chunk_frames("fused") == DEFAULT_CHUNK_FRAMES


# issue #40's families: tiny fixture (tests' `models`) -> the preset its directory picks,
# and the family its /v1/models entry names (config.json's model_type or model_index.json's
# pipeline class, as docs/models.md lists them)
RELEASES = {
    "flux1": ("flux", "FluxPipeline"),
    "flux2": ("flux2", "Flux2Pipeline"),
    "hunyuan_image": ("hunyuan_image", "HunyuanImagePipeline"),
    "hunyuan_video_t2v": ("hunyuan_video", "HunyuanVideo15Pipeline"),
    "hunyuan_video_i2v": ("hunyuan_video", "HunyuanVideo15ImageToVideoPipeline"),
    "ltx_video": ("ltx_video", "LTXPipeline"),
    "ltx2": ("ltx2", "LTX2Pipeline"),
    "wan22_t2v": ("wan", "WanPipeline"),  # A14B: two experts
    "wan22_i2v": ("wan", "WanImageToVideoPipeline"),  # A14B
    "wan22_ti2v": ("wan", "WanPipeline"),  # TI2V-5B
    "qwen2_5_omni": ("qwen2_5_omni", "qwen2_5_omni"),
    "qwen2_5_vl": ("qwen_vl", "qwen2_5_vl"),
    "qwen3_vl": ("qwen_vl", "qwen3_vl"),
    "whisper_hf": ("whisper_hf", "whisper"),
}


def test_release_directories_pick_their_preset_and_list_their_family(models):
    """`python -m omni.server --model DIR ...` over the tiny release directories: each is
    served under its name by the preset its config picks, and the metadata its /v1/models
    entry spreads in (ServedModel.card; the rest of the card needs live engines) names its
    family. No engine starts: the models are only constructed, as serve() does first."""
    dirs = {name: models(name) for name in RELEASES}
    args = parse_args([arg for d in dirs.values() for arg in ("--model", d)])
    served = {m.id: m for m in served_models(args, Metrics())}
    assert list(served) == list(RELEASES)  # no views among them
    for name, (preset, family) in RELEASES.items():
        pipeline = served[name].omni.pipeline
        assert pipeline.source.startswith(f"{preset_path(preset)} "), (name, pipeline.source)
        assert {s.model_dir for s in pipeline.stages} == {str(Path(dirs[name]).resolve())}
        assert served[name].metadata == {"random_weights": True, "families": [family]}, name


def test_a_video_model_where_pyav_is_missing_fails_at_start(models, monkeypatch):
    """Not a 500 on every video request (a GPU box without the PyAV wheel answered so)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "av" else real(name, *a, **k))
    args = parse_args(["--model", models("wan22_ti2v")])
    with pytest.raises(ConfigError, match="needs PyAV to encode MP4s"):
        served_models(args, Metrics())
    monkeypatch.setattr(importlib.util, "find_spec", real)
    assert [m.id for m in served_models(args, Metrics())] == ["wan22_ti2v"]
