"""Pipeline configuration: the YAML schema as frozen dataclasses, plus validation.

One YAML file describes one pipeline, a directed acyclic graph of stages (see
docs/pipeline.md). Everything is checked at load time so that a bad file fails
before any engine process starts, with a message naming the file, the field and the
fix. The result is immutable: the orchestrator and every engine process may share it
without defensive copies.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from omni.config.checks import (
    ConfigError,
    as_bool,
    as_int,
    as_list,
    as_mapping,
    as_positive_float,
    as_str,
    check_choice,
    check_keys,
    check_memory,
    check_stage_name,
    edge_end,
    model_dir_path,
    opt_str,
    optional,
    parse_memory,
    require,
)
from omni.config.control import parse_control_bind, parse_hang_timeout, parse_heartbeat
from omni.config.devices import check_devices, default_devices
from omni.config.environments import stage_python
from omni.config.frozen import Picklable, set_field
from omni.config.graph import (
    check_acyclic,
    check_all_needed,
    parse_defaults,
    parse_outputs,
    topo_order,
)
from omni.config.load_format import check_stage_load_format
from omni.config.memory import check_shares, parse_share
from omni.config.placement import ClusterSettings, parse_cluster, stage_placement  # noqa: I001
from omni.config.quantization import check_stage_quantization
from omni.config.request_defaults import parse_request_defaults
from omni.config.routes import (  # noqa: F401 - re-exported
    Route,
    UnknownModalityError,
    UnsupportedInputError,
    build_route,
)
from omni.config.session_settings import SessionSettings, parse_sessions
from omni.config.stages import EdgeConfig, StageConfig
from omni.config.views import parse_views
from omni.engines.kinds import ENGINE_KINDS

__all__ = [
    "CONNECTORS", "DELIVERIES", "ConfigError", "EdgeConfig", "PipelineConfig",
    "Route", "StageConfig", "UnknownModalityError", "load_pipeline_file", "parse_memory",
    "parse_pipeline",
]

DELIVERIES = ("full", "stream")
CONNECTORS = ("auto", "inline", "shm", "cuda_ipc", "zmq", "mooncake")

TOP_KEYS = ("name", "max_inflight", "request_timeout_s", "default_modalities", "stages",
            "edges", "outputs", "control_bind", "heartbeat_s", "hang_timeout_s", "views",
            "sessions", "cluster", "defaults")
STAGE_KEYS = ("name", "engine", "model", "model_dir", "devices", "replicas", "memory",
              "params", "options", "final_output", "restart", "launch", "inputs",
              "takes_request", "placement", "python", "env")
INPUT_MODALITIES = ("text", "audio", "image", "video")
EDGE_KEYS = ("from", "to", "payload", "delivery", "connector", "max_lead")


@dataclass(frozen=True)
class PipelineConfig(Picklable):
    """A validated pipeline. Build it with parse_pipeline() or load_pipeline_file()."""

    name: str
    stages: tuple[StageConfig, ...]
    edges: tuple[EdgeConfig, ...]
    outputs: Mapping[str, tuple[str, ...]]
    default_modalities: tuple[str, ...]
    max_inflight: int = 256
    request_timeout_s: float = 600.0
    control_bind: str | None = None  # the ROUTER's address; None: ipc:// in a private dir
    # engines' heartbeat interval; two missed: gone or busy? (omni/runtime/liveness.py); 0 = off
    heartbeat_s: float = 2.0
    hang_timeout_s: float = 60.0  # a live replica silent this long is hung; 0 = never
    source: str = "<dict>"
    # served ids that run a part of this pipeline on its engines (omni/config/views.py)
    views: Mapping[str, PipelineConfig] = field(default_factory=dict)
    sessions: SessionSettings = field(default_factory=SessionSettings)
    cluster: ClusterSettings | None = None  # set when a stage runs on other hosts
    # request params per output modality and stage (omni/config/request_defaults.py)
    defaults: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)

    @property
    def remote(self) -> bool:
        """Whether some replicas run on other hosts (placed by Ray)."""
        return any(stage.placement.remote for stage in self.stages)

    def __post_init__(self) -> None:
        set_field(self, "stages", tuple(self.stages))
        set_field(self, "edges", tuple(self.edges))
        set_field(self, "outputs", MappingProxyType({m: tuple(s) for m, s in self.outputs.items()}))
        set_field(self, "default_modalities", tuple(self.default_modalities))
        set_field(self, "views", MappingProxyType(dict(self.views)))
        set_field(self, "defaults", MappingProxyType(copy.deepcopy(dict(self.defaults))))

    @property
    def modalities(self) -> tuple[str, ...]:
        """Output modalities this pipeline produces, in `outputs` order."""
        return tuple(self.outputs)

    @cached_property
    def input_modalities(self) -> tuple[str, ...]:
        """What clients may send: each modality some route starts from (an entry stage
        that takes it, once entries that take none of it are left out), for some output
        (the assistant's voice_activity takes audio only, its text takes text too)."""
        taken = []
        for modality in INPUT_MODALITIES:
            for output in self.modalities:
                try:
                    self.route([output], [modality])
                except UnsupportedInputError:
                    continue
                taken.append(modality)
                break
        return tuple(taken)

    def stage(self, name: str) -> StageConfig:
        """The stage called `name`; KeyError if there is none."""
        return self._stage_index[name]

    def edge(self, src: str, dst: str) -> EdgeConfig:
        """The edge src -> dst; KeyError if there is none."""
        return self._edge_index[(src, dst)]

    def route(self, modalities: Iterable[str] | None = None,
              inputs: Iterable[str] | None = None) -> Route:
        """The route for `modalities` (None or empty: default_modalities); with `inputs`
        (the request's input modalities) an entry stage that takes none of them is left
        out, and what it fed starts from the request instead; cached."""
        key = (self._route_key(modalities), None if inputs is None else frozenset(inputs))
        route = self._routes.get(key)
        if route is None:  # a benign race at worst computes the same route twice
            route = self._routes[key] = build_route(self, *key)
        return route

    def _route_key(self, modalities: Iterable[str] | None) -> tuple[str, ...]:
        wanted = [modalities] if isinstance(modalities, str) else list(modalities or ())
        unknown = [m for m in wanted if m not in self.outputs]
        if unknown:
            raise UnknownModalityError(
                f"modality {unknown[0]!r} is not produced by pipeline {self.name!r}; "
                f"it produces: {', '.join(sorted(self.outputs))}"
            )
        return tuple(sorted(set(wanted or self.default_modalities)))

    # cached_property writes the instance __dict__ directly, so it works on frozen classes
    # and keeps these derived indexes out of __init__, repr and equality.
    @cached_property
    def _stage_index(self) -> dict[str, StageConfig]:
        return {s.name: s for s in self.stages}

    @cached_property
    def _edge_index(self) -> dict[tuple[str, str], EdgeConfig]:
        return {(e.src, e.dst): e for e in self.edges}

    @cached_property
    def _order(self) -> dict[str, int]:
        order = topo_order([s.name for s in self.stages], self.edges)
        return {name: i for i, name in enumerate(order)}

    @cached_property
    def _routes(self) -> dict[tuple[tuple[str, ...], frozenset[str] | None], Route]:
        return {}


# ----------------------------------------------------------------------------- loading


def load_pipeline_file(path: str | os.PathLike[str]) -> PipelineConfig:
    """Read and validate one pipeline YAML file; relative model_dir resolves next to it."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(source, "file", "not found", "Check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, "file", f"cannot read it ({exc})", "Check the path") from None
    data = _load_yaml(source, text)
    base_dir = os.path.dirname(os.path.abspath(path))
    return parse_pipeline(data, source, base_dir=base_dir, name=Path(path).stem)


def _load_yaml(source: str, text: str) -> Any:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "yaml"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(source, where, f"invalid YAML: {problem}",
                          "Fix the syntax (indentation, colons, brackets)") from None
    if data is None:
        raise ConfigError(source, "top level", "the file is empty", "Add at least 'stages:'")
    return data


def parse_pipeline(
    data: Mapping[str, Any],
    source: str = "<dict>",
    base_dir: str | None = None,
    name: str | None = None,
) -> PipelineConfig:
    """Validate a pipeline mapping. `name` is the fallback when `data` has no 'name';
    `base_dir` anchors relative model_dir paths (default: the current directory)."""
    if not isinstance(data, Mapping):
        raise ConfigError(source, "top level", f"expected a mapping, got {type(data).__name__}",
                          "Write 'name:', 'stages:', 'edges:' ... as top-level keys")
    check_keys(source, "", data, TOP_KEYS)
    stages = _parse_stages(source, data.get("stages"), base_dir)
    check_shares(source, stages)
    edges = _parse_edges(source, data.get("edges"), stages)
    check_acyclic(source, stages, edges)
    outputs = parse_outputs(source, data.get("outputs"), stages)
    check_all_needed(source, stages, edges, outputs)
    return PipelineConfig(
        name=as_str(source, "name", optional(data, "name", name or "pipeline")),
        stages=stages,
        edges=edges,
        outputs=outputs,
        default_modalities=parse_defaults(source, data.get("default_modalities"), outputs),
        max_inflight=as_int(source, "max_inflight", optional(data, "max_inflight", 256), 1),
        request_timeout_s=as_positive_float(
            source, "request_timeout_s", optional(data, "request_timeout_s", 600.0)
        ),
        control_bind=parse_control_bind(source, data.get("control_bind")),
        heartbeat_s=parse_heartbeat(source, data.get("heartbeat_s", 2.0)),
        hang_timeout_s=parse_hang_timeout(source, data.get("hang_timeout_s", 60.0)),
        source=source,
        views=parse_views(source, data, base_dir, parse_pipeline),
        sessions=parse_sessions(source, data.get("sessions")),
        cluster=parse_cluster(source, data.get("cluster"), stages),
        defaults=parse_request_defaults(source, data.get("defaults"),
                                        (s.name for s in stages), outputs),
    )


def _parse_stages(src: str, raw: object, base_dir: str | None) -> tuple[StageConfig, ...]:
    if raw is None or raw == []:
        raise ConfigError(src, "stages", "the pipeline has no stages",
                          "Add a 'stages:' list, e.g. '- {name: s, engine: echo}'")
    stages: list[StageConfig] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(as_list(src, "stages", raw, wrap_str=False)):
        stage = _parse_stage(src, f"stages[{i}]", item, base_dir)
        if stage.name == "client":  # the producer name of a client's stream input
            raise ConfigError(src, f"stages[{i}].name", "'client' is a reserved name",
                              "Pick another")
        if stage.name in seen:
            raise ConfigError(src, f"stages[{i}].name",
                              f"duplicate stage name '{stage.name}' (also stages[{seen[stage.name]}])",
                              "Give each stage a unique name")
        seen[stage.name] = i
        stages.append(stage)
    return tuple(stages)


def _parse_stage(src: str, path: str, raw: object, base_dir: str | None) -> StageConfig:
    raw = as_mapping(src, path, raw, allow_none=False)
    check_keys(src, path, raw, STAGE_KEYS)
    engine = require(src, path, raw, "engine", "echo")
    memory = raw.get("memory")
    share = parse_share(src, f"{path}.memory", memory)  # "60%" (else bytes, below)
    placement = stage_placement(src, path, raw)
    options = as_mapping(src, f"{path}.options", raw.get("options"))
    check_stage_quantization(src, path, raw, options)
    check_stage_load_format(src, path, raw, options)
    return StageConfig(
        name=check_stage_name(src, path, raw),
        engine=check_choice(src, f"{path}.engine", engine, ENGINE_KINDS, "engine"),
        model=opt_str(src, f"{path}.model", raw.get("model")),
        model_dir=model_dir_path(src, f"{path}.model_dir", raw.get("model_dir"), base_dir),
        devices=check_devices(src, f"{path}.devices",  # a bad engine has failed above
                              optional(raw, "devices", default_devices(engine))),
        replicas=as_int(src, f"{path}.replicas", optional(raw, "replicas", 1), 1),
        memory=None if memory is None or share else check_memory(src, f"{path}.memory", memory),
        memory_share=share,
        params=as_mapping(src, f"{path}.params", raw.get("params")),
        options=options,
        final_output=opt_str(src, f"{path}.final_output", raw.get("final_output")),
        restart=as_bool(src, f"{path}.restart", optional(raw, "restart", False)),
        launch=check_choice(src, f"{path}.launch", optional(raw, "launch", "local"),
                            ("local", "external"), "launch"),
        inputs=tuple(check_choice(src, f"{path}.inputs[{i}]", m, INPUT_MODALITIES, "input")
                     for i, m in enumerate(as_list(src, f"{path}.inputs",
                                                   optional(raw, "inputs", ["text"])))),
        takes_request=tuple(as_str(src, f"{path}.takes_request[{i}]", k) for i, k in enumerate(
            as_list(src, f"{path}.takes_request", optional(raw, "takes_request", [])))),
        placement=placement,
        python=stage_python(src, path, raw, base_dir, placement.remote),
    )



def _parse_edges(src: str, raw: object, stages: tuple[StageConfig, ...]) -> tuple[EdgeConfig, ...]:
    names = [s.name for s in stages]
    edges: list[EdgeConfig] = []
    seen: dict[tuple[str, str], int] = {}
    for i, item in enumerate(as_list(src, "edges", [] if raw is None else raw, wrap_str=False)):
        edge = _parse_edge(src, f"edges[{i}]", item, names)
        pair = (edge.src, edge.dst)
        if pair in seen:
            raise ConfigError(src, f"edges[{i}]",
                              f"duplicate edge '{edge.src}' -> '{edge.dst}' (also edges[{seen[pair]}])",
                              "Remove one; two stages are joined by at most one edge")
        seen[pair] = i
        edges.append(edge)
    return tuple(edges)


def _parse_edge(src: str, path: str, raw: object, names: list[str]) -> EdgeConfig:
    raw = as_mapping(src, path, raw, allow_none=False)
    check_keys(src, path, raw, EDGE_KEYS)
    producer = edge_end(src, path, raw, "from", names)
    consumer = edge_end(src, path, raw, "to", names)
    if producer == consumer:
        raise ConfigError(src, path, f"stage '{producer}' feeds itself",
                          "An edge joins two different stages; remove it")
    delivery = check_choice(src, f"{path}.delivery", optional(raw, "delivery", "full"),
                            DELIVERIES, "delivery")
    lead = optional(raw, "max_lead", None)
    if lead is not None and delivery != "stream":
        raise ConfigError(src, f"{path}.max_lead", "a lead is kept on stream edges only",
                          "Set delivery: stream, or remove max_lead")
    return EdgeConfig(
        src=producer,
        dst=consumer,
        payload=as_str(src, f"{path}.payload", optional(raw, "payload", "data")),
        delivery=delivery,
        connector=check_choice(src, f"{path}.connector", optional(raw, "connector", "auto"),
                               CONNECTORS, "connector"),
        max_lead=None if lead is None else as_int(src, f"{path}.max_lead", lead, 1),
    )


