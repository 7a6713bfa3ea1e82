"""Transcription reply shapes (omni/api/subtitles.py) and a stage's declared inputs."""

from __future__ import annotations

import pytest

from omni.api.subtitles import render, stream_deltas
from omni.config.pipeline import ConfigError, parse_pipeline

RESULT = {"text": "Hello there. General Kenobi.", "language": "en", "language_name": "english",
          "duration": 3661.5,
          "segments": [{"id": 0, "start": 0.0, "end": 1.25, "text": " Hello there."},
                       {"id": 1, "start": 3600.5, "end": 3661.5, "text": " General Kenobi."}]}


def test_subtitle_clocks_and_plain_text():
    srt, kind = render("srt", RESULT, False)
    assert kind == "text/plain"
    assert srt == ("1\n00:00:00,000 --> 00:00:01,250\nHello there.\n\n"
                   "2\n01:00:00,500 --> 01:01:01,500\nGeneral Kenobi.\n\n")
    vtt, kind = render("vtt", RESULT, False)
    assert kind == "text/vtt" and vtt.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.250\n")
    assert render("text", RESULT, False) == ("Hello there. General Kenobi.\n", "text/plain")
    body, kind = render("verbose_json", RESULT, True)
    assert kind == "application/json" and body["language"] == "english" and body["words"] == []
    assert body["usage"] == {"type": "duration", "seconds": 3662}


@pytest.mark.parametrize("texts", [[" Hello there.", " General Kenobi."],
                                   ["  ", " Hello there.", " General", " Kenobi. "],
                                   [" Hello there. General Kenobi."], []])
def test_stream_deltas_join_to_the_text(texts):
    raw = "".join(texts)
    result = {"text": raw.strip(), "segments": [{"text": t} for t in texts]}
    deltas = stream_deltas(result)
    assert "".join(deltas) == result["text"] and all(deltas)
    assert len(deltas) <= max(1, len(texts))


def _pipeline(inputs):
    stage = {"name": "a", "engine": "echo"}
    if inputs is not None:
        stage["inputs"] = inputs
    return parse_pipeline({"name": "p", "stages": [stage, {"name": "b", "engine": "echo",
                                                          "inputs": ["image"],
                                                          "final_output": "text"}],
                           "edges": [{"from": "a", "to": "b"}], "outputs": {"text": ["b"]}})


def test_a_pipeline_takes_what_some_route_starts_from():
    # b (image) is fed by a, but starts the route when a takes none of the inputs
    assert _pipeline(None).input_modalities == ("text", "image")
    assert _pipeline(["audio", "text"]).input_modalities == ("text", "audio", "image")
    assert _pipeline([]).input_modalities == ("image",)
    assert _pipeline(None).route(["text"], ["image"]).stages == ("b",)
    assert _pipeline(None).route(["text"], ["text", "image"]).stages == ("a", "b")
    with pytest.raises(ConfigError, match="unknown input 'speech'"):
        _pipeline(["speech"])
