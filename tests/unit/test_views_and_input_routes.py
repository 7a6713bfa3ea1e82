"""Views (served ids on a pipeline's own engines) and routes chosen by a request's inputs:
presets/assistant.yaml's graph, and the transcript rejoining the chat (ar/inputs.py)."""

from __future__ import annotations

import pytest

from omni.config.pipeline import ConfigError, UnsupportedInputError, parse_pipeline
from omni.config.presets import load_pipeline
from omni.engines.ar.inputs import with_transcripts
from omni.runtime.routing import plan_route


@pytest.fixture(scope="module")
def assistant():
    return load_pipeline("assistant")


@pytest.mark.parametrize(("outputs", "inputs", "stages", "entries"), [
    (["text"], ["text"], ("llm",), ("llm",)),
    (["text"], ["text", "audio"], ("asr", "llm"), ("asr",)),
    (["text", "audio"], ["text"], ("llm", "tts"), ("llm",)),
    (["text", "audio"], ["text", "audio"], ("asr", "llm", "tts"), ("asr",)),
    (["audio"], None, ("asr", "llm", "tts"), ("asr",)),  # no inputs given: the whole graph
])
def test_routes_follow_inputs_and_outputs(assistant, outputs, inputs, stages, entries):
    route = assistant.route(outputs, inputs)
    assert (route.stages, route.entries) == (stages, entries)
    assert assistant.route(outputs, inputs) is route  # cached


def test_a_stage_fed_by_others_still_gets_the_request_keys_it_takes(assistant):
    plan = plan_route(assistant, assistant.route(["text"], ["text", "audio"]))
    assert plan.request_keys == {"llm": ("messages", "tools")}
    inputs = plan.ready_inputs("llm", {"asr": [{"text": "hi"}]},
                               {"messages": ["m"], "audio": ["big"]})
    assert inputs == {"messages": ["m"], "asr": [{"text": "hi"}]}  # not the audio again
    assert plan.final_modality == {"llm": "text"}


def test_views_are_pipelines_of_their_own(assistant):
    views = assistant.views
    assert sorted(views) == ["piper", "smollm2", "whisper"]
    assert [s.name for s in views["whisper"].stages] == ["asr"]
    assert views["whisper"].outputs == {"text": ("asr",)}
    assert views["whisper"].input_modalities == ("audio",)
    assert views["piper"].modalities == ("audio",) and views["piper"].edges == ()
    assert assistant.input_modalities == ("text", "audio")
    with pytest.raises(UnsupportedInputError, match="from text input"):
        views["whisper"].route(["text"], ["text"])


def _with_views(views):
    return {"name": "p", "stages": [
        {"name": "a", "engine": "echo"},
        {"name": "b", "engine": "echo", "final_output": "text"}],
        "edges": [{"from": "a", "to": "b"}], "views": views}


def test_bad_views_name_the_field():
    with pytest.raises(ConfigError, match=r"views.x.stages\[0\].*unknown stage 'c'"):
        parse_pipeline(_with_views({"x": {"stages": ["c"]}}))
    with pytest.raises(ConfigError, match="a view cannot have its pipeline's name"):
        parse_pipeline(_with_views({"p": {"stages": ["b"]}}))
    with pytest.raises(ConfigError, match=r"\(view .x.\): outputs: the pipeline has no output"):
        parse_pipeline(_with_views({"x": {"stages": ["a"]}}))
    ok = parse_pipeline(_with_views({"x": {"stages": ["a"], "outputs": {"text": ["a"]}}}))
    assert ok.views["x"].stage("a").final_output == "text"
    assert ok.stage("a").final_output is None  # the pipeline itself is unchanged


def test_transcripts_replace_the_audio_parts_in_order():
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [
                    {"type": "text", "text": "First: "},
                    {"type": "input_audio", "input_audio": {"transcript": 1}},
                    {"type": "input_audio", "input_audio": {"transcript": 0}}]}]
    inputs = {"messages": messages, "asr": [{"text": " zero "}, {"text": "one"}]}
    out = with_transcripts(messages, inputs)
    assert [p["text"] for p in out[1]["content"]] == ["First: ", "one", "zero"]
    assert messages[1]["content"][1]["type"] == "input_audio"  # the caller's list untouched
    with pytest.raises(ValueError, match="has no transcript"):
        with_transcripts(messages, {"messages": messages, "asr": [{"text": "only"}]})
