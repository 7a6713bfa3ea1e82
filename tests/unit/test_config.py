"""Pipeline YAML schema: parsing, defaults, model_dir, memory values, immutability, presets
(validation messages: test_config_errors.py; outputs and routes: test_config_outputs.py)."""

from __future__ import annotations

import dataclasses
import os
import pickle
from pathlib import Path
from types import MappingProxyType

import pytest
from unit.pipeline_yaml import BASE, error, load, stages_yaml

from omni.config.pipeline import (
    CONNECTORS,
    DELIVERIES,
    ConfigError,
    EdgeConfig,
    StageConfig,
    load_pipeline_file,
    parse_memory,
    parse_pipeline,
)
from omni.engines.kinds import ENGINE_KINDS

PRESETS = Path(__file__).resolve().parents[2] / "omni" / "config" / "presets"


# ----------------------------------------------------------------------------- happy path


def test_full_example_parses(tmp_path: Path) -> None:
    cfg = load(tmp_path, BASE + "max_inflight: 8\nrequest_timeout_s: 30\n")
    assert cfg.name == "demo"
    assert cfg.max_inflight == 8 and cfg.request_timeout_s == 30.0
    assert isinstance(cfg.request_timeout_s, float)
    assert [s.name for s in cfg.stages] == ["thinker", "talker", "code2wav"]
    assert dict(cfg.outputs) == {"text": ("thinker",), "audio": ("code2wav",)}
    assert cfg.modalities == ("text", "audio")
    assert cfg.default_modalities == ("text",)
    assert cfg.source == str(tmp_path / "pipe.yaml")
    edge = cfg.edge("thinker", "talker")
    assert edge == EdgeConfig("thinker", "talker", "hidden_states", "stream", "auto")
    assert cfg.edge("talker", "code2wav").payload == "data"
    assert cfg.edge("talker", "code2wav").delivery == "full"


def test_stage_defaults(tmp_path: Path) -> None:
    stage = load(tmp_path, stages_yaml("{name: s, engine: echo, final_output: text}")).stage("s")
    assert stage == StageConfig(name="s", engine="echo", final_output="text")
    assert stage.devices == ("cpu",) and stage.replicas == 1 and stage.memory is None
    assert dict(stage.params) == {} and dict(stage.options) == {}
    assert stage.model is None and stage.model_dir is None


def test_stage_fields(tmp_path: Path) -> None:
    cfg = load(tmp_path, """
        stages:
          - name: s
            engine: ar
            model: some_adapter
            devices: [cuda:0, cuda, cpu, cuda:01]
            replicas: 2
            memory: 2GiB
            params: {temperature: 0.5, stop: [x]}
            options: {chunks: 2, delay_ms: 5}
            final_output: text
    """)
    stage = cfg.stage("s")
    assert stage.devices == ("cuda:0", "cuda", "cpu", "cuda:1")
    assert stage.replicas == 2 and stage.memory == 2 * 1024**3
    assert stage.params["stop"] == ["x"] and stage.options["chunks"] == 2


def test_name_defaults_to_file_stem(tmp_path: Path) -> None:
    cfg = load(tmp_path, stages_yaml("{name: s, engine: echo, final_output: text}"), "my_pipe.yaml")
    assert cfg.name == "my_pipe"


def test_parse_pipeline_from_dict() -> None:
    data = {"stages": [{"name": "s", "engine": "echo", "final_output": "text"}]}
    cfg = parse_pipeline(data, name="fallback")
    assert cfg.name == "fallback" and cfg.source == "<dict>"
    assert parse_pipeline(data).name == "pipeline"


def test_single_device_string_is_wrapped(tmp_path: Path) -> None:
    cfg = load(tmp_path, stages_yaml("{name: s, engine: echo, devices: cuda:3, final_output: text}"))
    assert cfg.stage("s").devices == ("cuda:3",)


def test_empty_optional_values_mean_default(tmp_path: Path) -> None:
    cfg = load(tmp_path, """
        max_inflight:
        edges:
        stages:
          - name: s
            engine: echo
            params:
            replicas:
            final_output: text
    """)
    assert cfg.max_inflight == 256 and cfg.edges == () and cfg.stage("s").replicas == 1


def test_engine_and_choice_constants() -> None:
    assert ENGINE_KINDS == ("ar", "vllm", "generation", "diffusion", "policy", "echo")
    assert DELIVERIES == ("full", "stream")
    assert CONNECTORS == ("auto", "inline", "shm", "cuda_ipc", "zmq", "mooncake")


def test_stage_and_edge_lookup_errors(tmp_path: Path) -> None:
    cfg = load(tmp_path, BASE)
    with pytest.raises(KeyError):
        cfg.stage("nope")
    with pytest.raises(KeyError):
        cfg.edge("talker", "thinker")


# ----------------------------------------------------------------------------- model_dir


def test_relative_model_dir_resolves_against_yaml_dir(tmp_path: Path) -> None:
    sub = tmp_path / "conf"
    sub.mkdir()
    text = stages_yaml("{name: s, engine: echo, model_dir: ../weights/m, final_output: text}")
    cfg = load(sub, text)
    assert cfg.stage("s").model_dir == str(tmp_path / "weights" / "m")
    assert os.path.isabs(cfg.stage("s").model_dir)


def test_absolute_model_dir_kept(tmp_path: Path) -> None:
    cfg = load(tmp_path, stages_yaml("{name: s, engine: echo, model_dir: /opt/m, final_output: text}"))
    assert cfg.stage("s").model_dir == "/opt/m"


def test_model_dir_base_dir_argument(tmp_path: Path) -> None:
    data = {"stages": [{"name": "s", "engine": "echo", "model_dir": "m", "final_output": "t"}]}
    assert parse_pipeline(data, base_dir=str(tmp_path)).stage("s").model_dir == str(tmp_path / "m")


# ----------------------------------------------------------------------------- memory


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1024, 1024),
        ("1024", 1024),
        ("512MiB", 512 * 2**20),
        ("2GiB", 2 * 2**30),
        ("1.5GB", 1_500_000_000),
        ("100MB", 100_000_000),
        ("4 kib", 4096),
        ("1TiB", 2**40),
        ("10B", 10),
    ],
)
def test_parse_memory(value: int | str, expected: int) -> None:
    assert parse_memory(value) == expected


@pytest.mark.parametrize("value", ["lots", "2 gigs", "-1GB", "1.5", "0", 0, -5, True, 1.5, "GB", ""])
def test_parse_memory_rejects(value: object) -> None:
    with pytest.raises(ValueError, match="512MiB"):
        parse_memory(value)  # type: ignore[arg-type]


def test_bad_memory_in_file(tmp_path: Path) -> None:
    error(tmp_path, stages_yaml("{name: s, engine: echo, memory: 2 gigs, final_output: text}"),
          "stages[0].memory", "bad memory value '2 gigs'", "'2GiB'")


# ----------------------------------------------------------------------------- immutability


def test_configs_are_frozen(tmp_path: Path) -> None:
    cfg = load(tmp_path, BASE)
    stage, edge, route = cfg.stages[0], cfg.edges[0], cfg.route(None)
    for obj, attr in [(cfg, "name"), (stage, "replicas"), (edge, "delivery"), (route, "stages")]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, attr, None)
    with pytest.raises(TypeError):
        cfg.outputs["video"] = ("thinker",)  # type: ignore[index]
    with pytest.raises(TypeError):
        stage.params["x"] = 1  # type: ignore[index]
    with pytest.raises(TypeError):
        route.producers["x"] = ()  # type: ignore[index]


def test_params_are_deep_copied() -> None:
    params = {"stop": ["a"]}
    stage = StageConfig(name="s", engine="echo", params=params)
    params["stop"].append("b")
    params["new"] = 1
    assert dict(stage.params) == {"stop": ["a"]}


def test_configs_pickle(tmp_path: Path) -> None:
    # Configs travel to spawned engine processes; MappingProxyType alone cannot pickle.
    cfg = load(tmp_path, BASE + "  - {from: thinker, to: code2wav}\n")
    cfg.route(["audio"])
    clone = pickle.loads(pickle.dumps(cfg))
    assert clone == cfg and clone is not cfg
    assert isinstance(clone.stages[0].params, MappingProxyType)
    assert clone.route(["audio"]) == cfg.route(["audio"])
    with pytest.raises(TypeError):
        clone.outputs["x"] = ()  # type: ignore[index]


def test_config_error_pickles() -> None:
    err = ConfigError("f.yaml", "stages[0].engine", "unknown engine 'x'", "Valid: echo")
    clone = pickle.loads(pickle.dumps(err))
    assert str(clone) == str(err) == "f.yaml: stages[0].engine: unknown engine 'x'. Valid: echo"
    assert clone.path == "stages[0].engine"


# ----------------------------------------------------------------------------- presets


def test_echo_preset() -> None:
    cfg = load_pipeline_file(PRESETS / "echo.yaml")
    assert cfg.name == "echo" and cfg.max_inflight == 256
    assert [(s.name, s.engine, s.final_output) for s in cfg.stages] == [("echo", "echo", "text")]
    assert cfg.route(None).stages == ("echo",)


def test_echo_chain_preset() -> None:
    cfg = load_pipeline_file(PRESETS / "echo_chain.yaml")
    assert all(s.engine == "echo" for s in cfg.stages)
    assert all(e.delivery == "full" for e in cfg.edges)
    assert cfg.route(["text"]).stages == ("a", "b", "c")
    assert cfg.route(["audio"]).stages == ("a", "side")
    both = cfg.route(["text", "audio"])
    assert both.stages == ("a", "b", "c", "side")
    assert both.finals == frozenset({"c", "side"}) and both.entries == ("a",)
    assert both.consumers["a"] == ("b", "side")
    assert cfg.route(None).modalities == ("text",)


def test_auto_device_is_accepted_and_kept_for_the_engine_to_resolve() -> None:
    config = parse_pipeline({"stages": [{"name": "s", "engine": "echo", "final_output": "text",
                                         "devices": ["auto", "cuda:01"]}]})
    assert config.stage("s").devices == ("auto", "cuda:1")


def test_stage_name_stream_is_reserved() -> None:
    with pytest.raises(ConfigError, match="'stream' is a reserved name"):
        parse_pipeline({"stages": [{"name": "stream", "engine": "echo", "final_output": "text"}]})
