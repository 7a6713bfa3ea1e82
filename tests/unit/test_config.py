"""Pipeline YAML schema: parsing, validation messages, routes, immutability, presets."""

from __future__ import annotations

import dataclasses
import os
import pickle
import textwrap
from pathlib import Path
from types import MappingProxyType

import pytest

from omni.config.pipeline import (
    CONNECTORS,
    DELIVERIES,
    ConfigError,
    EdgeConfig,
    PipelineConfig,
    StageConfig,
    UnknownModalityError,
    load_pipeline_file,
    parse_memory,
    parse_pipeline,
)
from omni.engines.kinds import ENGINE_KINDS

PRESETS = Path(__file__).resolve().parents[2] / "omni" / "config" / "presets"

# A valid two-modality pipeline; tests patch one piece of it at a time.
BASE = """
name: demo
stages:
  - {name: thinker, engine: echo, final_output: text}
  - {name: talker, engine: echo}
  - {name: code2wav, engine: echo, final_output: audio}
edges:
  - {from: thinker, to: talker, payload: hidden_states, delivery: stream}
  - {from: talker, to: code2wav}
"""


def write(tmp_path: Path, text: str, name: str = "pipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def load(tmp_path: Path, text: str, name: str = "pipe.yaml") -> PipelineConfig:
    return load_pipeline_file(write(tmp_path, text, name))


def error(tmp_path: Path, text: str, *fragments: str, name: str = "pipe.yaml") -> str:
    """Load `text`, expect a ConfigError and check the message holds every fragment."""
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text, name)
    message = str(info.value)
    assert message.startswith(str(tmp_path / name) + ": "), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def stages_yaml(*lines: str) -> str:
    return "stages:\n" + "".join(f"  - {line}\n" for line in lines)


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
