"""Picking the built-in pipeline for a model directory, and naming the served model."""

from __future__ import annotations

import json

import pytest

from omni.config.pipeline import ConfigError
from omni.config.presets import load_pipeline


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
def test_a_qwen3_tts_release_gets_the_ar_talker_and_code2wav(tmp_path, tts_type):
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
