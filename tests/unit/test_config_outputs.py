"""Pipeline YAML outputs and routes: output errors, top-level values, the route of a set of
modalities."""

from __future__ import annotations

from pathlib import Path

import pytest
from unit.pipeline_yaml import BASE, error, load, stages_yaml

from omni.config.pipeline import UnknownModalityError

# ----------------------------------------------------------------------------- output errors


def test_no_outputs(tmp_path: Path) -> None:
    error(tmp_path, stages_yaml("{name: s, engine: echo}"),
          "outputs: the pipeline has no output modality", "Set 'final_output: text'")


def test_outputs_unknown_stage(tmp_path: Path) -> None:
    error(tmp_path, BASE + "outputs: {text: [thinkr], audio: [code2wav]}\n",
          "outputs.text[0]: unknown stage 'thinkr'", "Did you mean 'thinker'?")


def test_outputs_stage_with_other_final_output(tmp_path: Path) -> None:
    error(tmp_path, BASE + "outputs: {text: [thinker, code2wav], audio: [code2wav]}\n",
          "outputs.text[1]: stage 'code2wav' has final_output 'audio', not 'text'",
          "Set 'final_output: text' on stage 'code2wav'")


def test_outputs_stage_without_final_output(tmp_path: Path) -> None:
    error(tmp_path, BASE + "outputs: {text: [thinker, talker], audio: [code2wav]}\n",
          "outputs.text[1]: stage 'talker' has no final_output", "Set 'final_output: text'")


def test_final_output_not_listed(tmp_path: Path) -> None:
    error(tmp_path, BASE + "outputs: {text: [thinker]}\n",
          "stages[2].final_output: stage 'code2wav' emits 'audio' but outputs.audio does not list it",
          "Add 'code2wav' to outputs.audio")


def test_outputs_empty_modality(tmp_path: Path) -> None:
    error(tmp_path, BASE + "outputs: {text: [thinker], audio: []}\n",
          "outputs.audio: modality 'audio' lists no stages", "remove it")


def test_outputs_not_mapping(tmp_path: Path) -> None:
    error(tmp_path, BASE + "outputs: [thinker]\n", "outputs: expected a mapping")


def test_unused_stage(tmp_path: Path) -> None:
    text = BASE.replace("stages:\n", "stages:\n  - {name: orphan, engine: echo}\n")
    msg = error(tmp_path, text, "stages[0]: stage 'orphan' is not needed by any output modality")
    assert msg.endswith("(no path to a final stage). Connect it with an edge or remove it")


def test_stage_downstream_of_finals_is_unused(tmp_path: Path) -> None:
    # A stage fed by a final stage but emitting nothing itself is still dead weight.
    text = BASE.replace("stages:\n", "stages:\n  - {name: tail, engine: echo}\n")
    error(tmp_path, text + "  - {from: code2wav, to: tail}\n", "stage 'tail' is not needed")


# ----------------------------------------------------------------------------- top-level values


def test_default_modalities(tmp_path: Path) -> None:
    assert load(tmp_path, BASE + "default_modalities: [audio, text, audio]\n").default_modalities == (
        "audio", "text")
    assert load(tmp_path, BASE + "default_modalities: audio\n").default_modalities == ("audio",)


def test_default_modality_not_in_outputs(tmp_path: Path) -> None:
    error(tmp_path, BASE + "default_modalities: [txt]\n",
          "default_modalities[0]: modality 'txt' is not in outputs", "Did you mean 'text'?")
    error(tmp_path, BASE + "default_modalities: []\n", "default_modalities: the list is empty")


@pytest.mark.parametrize(
    ("line", "fragment"),
    [("max_inflight: 0", "max_inflight: must be >= 1"),
     ("max_inflight: true", "max_inflight: expected an integer, got boolean"),
     ("max_inflight: many", "max_inflight: expected an integer, got string"),
     ("request_timeout_s: 0", "request_timeout_s: must be a finite number > 0"),
     ("request_timeout_s: -3", "request_timeout_s: must be a finite number > 0"),
     ("request_timeout_s: .inf", "request_timeout_s: must be a finite number > 0"),
     ("request_timeout_s: soon", "request_timeout_s: expected a number, got string"),
     ("request_timeout_s: false", "request_timeout_s: expected a number, got boolean"),
     ("name: 5", "name: expected a non-empty string")],
)
def test_bad_top_level_values(tmp_path: Path, line: str, fragment: str) -> None:
    error(tmp_path, BASE + line + "\n", fragment)


# ----------------------------------------------------------------------------- routes


def test_route_single_modality(tmp_path: Path) -> None:
    route = load(tmp_path, BASE).route(["text"])
    assert route.modalities == ("text",)
    assert route.stages == ("thinker",)
    assert route.finals == frozenset({"thinker"})
    assert route.entries == ("thinker",)
    assert dict(route.producers) == {"thinker": ()}
    assert dict(route.consumers) == {"thinker": ()}  # talker is off the route


def test_route_two_modalities(tmp_path: Path) -> None:
    route = load(tmp_path, BASE).route(["text", "audio", "text"])
    assert route.modalities == ("audio", "text")
    assert route.stages == ("thinker", "talker", "code2wav")
    assert route.finals == frozenset({"thinker", "code2wav"})
    assert route.entries == ("thinker",)
    assert route.producers["code2wav"] == ("talker",)
    assert route.consumers["thinker"] == ("talker",)


def test_route_default_and_cache(tmp_path: Path) -> None:
    cfg = load(tmp_path, BASE)
    assert cfg.route(None) is cfg.route([]) is cfg.route(["text"]) is cfg.route("text")
    assert cfg.route(["audio", "text"]) is cfg.route(("text", "audio"))


def test_route_unknown_modality(tmp_path: Path) -> None:
    with pytest.raises(UnknownModalityError) as info:
        load(tmp_path, BASE).route(["video"])
    assert str(info.value) == "modality 'video' is not produced by pipeline 'demo'; it produces: audio, text"
    assert isinstance(info.value, ValueError)


def test_route_topological_order_and_multiple_entries(tmp_path: Path) -> None:
    # Declared out of order; two entries (x, y) join at z; w is a second final.
    text = stages_yaml("{name: z, engine: echo, final_output: text}", "{name: y, engine: echo}",
                       "{name: x, engine: echo}", "{name: w, engine: echo, final_output: audio}")
    text += "edges:\n  - {from: x, to: z}\n  - {from: y, to: z}\n  - {from: x, to: w}\n  - {from: y, to: x}\n"
    cfg = load(tmp_path, text)
    route = cfg.route(["text"])
    assert route.stages == ("y", "x", "z")
    assert route.entries == ("y",)
    assert route.producers["z"] == ("y", "x")
    assert route.consumers["x"] == ("z",)  # x -> w is off the text route
    assert cfg.route(["audio"]).stages == ("y", "x", "w")


def test_route_producers_only_on_route(tmp_path: Path) -> None:
    text = stages_yaml("{name: a, engine: echo}", "{name: b, engine: echo, final_output: audio}",
                       "{name: c, engine: echo, final_output: text}")
    text += "edges:\n  - {from: a, to: c}\n  - {from: b, to: c}\n"
    route = load(tmp_path, text).route(["text"])
    assert route.stages == ("a", "b", "c")
    assert set(route.entries) == {"a", "b"}
    audio = load(tmp_path, text).route(["audio"])
    assert audio.stages == ("b",) and audio.consumers["b"] == ()
