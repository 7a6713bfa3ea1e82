"""Pipeline YAML validation messages: file-level errors, unknown keys, stage and edge errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from unit.pipeline_yaml import BASE, error, load, stages_yaml

from omni.config.pipeline import ConfigError, load_pipeline_file, parse_pipeline

# ----------------------------------------------------------------------------- file-level errors


def test_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found") as info:
        load_pipeline_file(tmp_path / "missing.yaml")
    assert "missing.yaml" in str(info.value)


def test_yaml_syntax_error(tmp_path: Path) -> None:
    error(tmp_path, "stages: [\n  - name: a\n", "invalid YAML", "line", "Fix the syntax")


def test_empty_file(tmp_path: Path) -> None:
    error(tmp_path, "", "top level", "empty")


def test_top_level_not_mapping(tmp_path: Path) -> None:
    error(tmp_path, "- a\n- b\n", "top level: expected a mapping, got list")


def test_parse_pipeline_rejects_non_mapping() -> None:
    with pytest.raises(ConfigError, match=r"^<dict>: top level: expected a mapping"):
        parse_pipeline(["x"])  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- unknown keys


def test_unknown_top_key(tmp_path: Path) -> None:
    error(tmp_path, BASE + "max_inflite: 3\n",
          "max_inflite: unknown key 'max_inflite'", "Did you mean 'max_inflight'?", "Valid: ")


def test_unknown_stage_key(tmp_path: Path) -> None:
    msg = error(tmp_path, stages_yaml("{name: s, engine: echo, replica: 2, final_output: text}"),
                "stages[0].replica: unknown key 'replica'", "Did you mean 'replicas'?")
    assert "final_output" in msg  # the list of valid keys


def test_unknown_edge_key(tmp_path: Path) -> None:
    error(tmp_path, BASE.replace("{from: talker, to: code2wav}", "{from: talker, to: code2wav, conector: shm}"),
          "edges[1].conector: unknown key", "Did you mean 'connector'?")


# ----------------------------------------------------------------------------- stage errors


def test_no_stages(tmp_path: Path) -> None:
    error(tmp_path, "name: x\n", "stages: the pipeline has no stages", "Add a 'stages:' list")
    error(tmp_path, "stages: []\n", "stages: the pipeline has no stages")


def test_stages_not_a_list(tmp_path: Path) -> None:
    error(tmp_path, "stages: {name: a}\n", "stages: expected a list")


def test_missing_required_stage_fields(tmp_path: Path) -> None:
    error(tmp_path, stages_yaml("{engine: echo, final_output: text}"),
          "stages[0].name: missing required field", "Add 'name:")
    error(tmp_path, stages_yaml("{name: s, final_output: text}"),
          "stages[0].engine: missing required field", "Add 'engine: echo'")


def test_stage_entry_not_mapping(tmp_path: Path) -> None:
    error(tmp_path, stages_yaml("just_a_name"), "stages[0]: expected a mapping")


def test_unknown_engine(tmp_path: Path) -> None:
    text = stages_yaml("{name: a, engine: echo, final_output: text}", "{name: b, engine: ehco}")
    text += "edges: [{from: b, to: a}]\n"
    msg = error(tmp_path, text, "stages[1].engine: unknown engine 'ehco'")
    assert msg.endswith("Did you mean 'echo'? Valid: ar, diffusion, echo, generation, policy, vllm")


def test_duplicate_stage_name(tmp_path: Path) -> None:
    error(tmp_path, stages_yaml("{name: a, engine: echo}", "{name: a, engine: echo}"),
          "stages[1].name: duplicate stage name 'a' (also stages[0])", "unique")


@pytest.mark.parametrize(("bad", "fixed"), [("Thinker", "thinker"), ("my stage", "my_stage"), ("a.b", "a_b")])
def test_bad_stage_name(tmp_path: Path, bad: str, fixed: str) -> None:
    error(tmp_path, stages_yaml(f"{{name: '{bad}', engine: echo, final_output: text}}"),
          "stages[0].name: bad stage name", f"e.g. '{fixed}'")


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "cuda:-1", "cpu:0", "0"])
def test_bad_device(tmp_path: Path, device: str) -> None:
    error(tmp_path, stages_yaml(f"{{name: s, engine: echo, devices: ['{device}'], final_output: text}}"),
          "stages[0].devices[0]: bad device", "Use 'auto', 'cpu', 'cuda' or 'cuda:N'")


def test_integer_device_suggests_cuda(tmp_path: Path) -> None:
    error(tmp_path, stages_yaml("{name: s, engine: echo, devices: [cpu, 1], final_output: text}"),
          "stages[0].devices[1]: bad device 1", "Did you mean 'cuda:1'?")


def test_empty_devices(tmp_path: Path) -> None:
    error(tmp_path, stages_yaml("{name: s, engine: echo, devices: [], final_output: text}"),
          "stages[0].devices: the device list is empty")


@pytest.mark.parametrize(
    ("value", "fragment"),
    [("0", "must be >= 1, got 0"), ("'2'", "expected an integer, got string '2'"),
     ("true", "expected an integer, got boolean True"), ("1.5", "expected an integer, got number 1.5")],
)
def test_bad_replicas(tmp_path: Path, value: str, fragment: str) -> None:
    error(tmp_path, stages_yaml(f"{{name: s, engine: echo, replicas: {value}, final_output: text}}"),
          "stages[0].replicas", fragment)


def test_quoted_int_hint(tmp_path: Path) -> None:
    error(tmp_path, stages_yaml("{name: s, engine: echo, replicas: '2', final_output: text}"),
          "Write it without quotes")


def test_params_must_be_mapping(tmp_path: Path) -> None:
    error(tmp_path, stages_yaml("{name: s, engine: echo, params: [1, 2], final_output: text}"),
          "stages[0].params: expected a mapping, got list")


def test_model_must_be_string(tmp_path: Path) -> None:
    error(tmp_path, stages_yaml("{name: s, engine: echo, model: 3, final_output: text}"),
          "stages[0].model: expected a non-empty string, got integer 3")


# ----------------------------------------------------------------------------- edge errors


def test_edge_unknown_stage(tmp_path: Path) -> None:
    error(tmp_path, BASE.replace("{from: talker, to: code2wav}", "{from: talker, to: code2wv}"),
          "edges[1].to: unknown stage 'code2wv'", "Did you mean 'code2wav'?")
    error(tmp_path, BASE.replace("{from: talker, to: code2wav}", "{from: tlker, to: code2wav}"),
          "edges[1].from: unknown stage 'tlker'", "Did you mean 'talker'?")


def test_edge_missing_end(tmp_path: Path) -> None:
    error(tmp_path, BASE.replace("{from: talker, to: code2wav}", "{from: talker}"),
          "edges[1].to: missing required field")


def test_self_edge(tmp_path: Path) -> None:
    error(tmp_path, BASE + "  - {from: talker, to: talker}\n",
          "edges[2]: stage 'talker' feeds itself", "remove it")


def test_duplicate_edge(tmp_path: Path) -> None:
    error(tmp_path, BASE + "  - {from: talker, to: code2wav, delivery: stream}\n",
          "edges[2]: duplicate edge 'talker' -> 'code2wav' (also edges[1])")


def test_bad_delivery(tmp_path: Path) -> None:
    error(tmp_path, BASE.replace("delivery: stream", "delivery: streem"),
          "edges[0].delivery: unknown delivery 'streem'", "Did you mean 'stream'?", "Valid: full, stream")


def test_max_lead(tmp_path: Path) -> None:
    led = BASE.replace("delivery: stream}", "delivery: stream, max_lead: 8}")
    assert [e.max_lead for e in load(tmp_path, led).edges] == [8, None]
    error(tmp_path, led.replace("max_lead: 8", "max_lead: 0"), "edges[0].max_lead: must be >= 1")
    error(tmp_path, led.replace("max_lead: 8", "max_lead: '8'"), "edges[0].max_lead: expected an integer")
    error(tmp_path, BASE.replace("{from: talker, to: code2wav}", "{from: talker, to: code2wav, max_lead: 4}"),
          "edges[1].max_lead: a lead is kept on stream edges only", "Set delivery: stream")


def test_bad_connector(tmp_path: Path) -> None:
    error(tmp_path, BASE.replace("{from: talker, to: code2wav}", "{from: talker, to: code2wav, connector: cuda-ipc}"),
          "edges[1].connector: unknown connector 'cuda-ipc'", "Did you mean 'cuda_ipc'?")


def test_cycle_is_named(tmp_path: Path) -> None:
    text = stages_yaml("{name: a, engine: echo}", "{name: b, engine: echo}",
                       "{name: c, engine: echo, final_output: text}")
    text += "edges:\n  - {from: a, to: b}\n  - {from: b, to: a}\n  - {from: b, to: c}\n"
    error(tmp_path, text, "edges: the stages form a cycle: a -> b -> a", "remove one of these edges")
