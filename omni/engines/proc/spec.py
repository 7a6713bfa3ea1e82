"""EngineSpec: everything an engine process needs, built from a pipeline's stage.

One builder for both ways a replica starts: forked by the launcher, or started by
something else with `python -m omni.engines.proc` (its own host, its own supervisor).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

import msgspec

from omni.config.pipeline import PipelineConfig


@dataclass(frozen=True)
class EngineSpec:
    """Everything an engine process needs (picklable, plain values)."""

    replica_id: str
    stage: str
    engine: str
    control_address: str  # the pipeline's ROUTER: ipc://PATH or tcp://HOST:PORT
    incarnation: int = 0  # +1 per restart of this replica: its identity is replica@incarnation
    heartbeat_s: float = 0.0  # heartbeat interval; 0 = none
    model: str | None = None
    model_dir: str | None = None
    device: str = "cpu"
    dtype: str = "auto"
    options: dict[str, Any] = field(default_factory=dict)
    log_level: int = logging.INFO
    arena_name: str | None = None  # shared-memory name prefix of this replica's payloads
    payload_options: dict[str, Any] = field(default_factory=dict)  # make_connector kwargs
    memory: int | None = None  # the stage's memory budget in bytes (engines that size caches)
    memory_share: float | None = None  # or its share of the device (omni/config/memory.py)
    curve: dict[str, str] | None = None  # CURVE keys of the control channel (another host)
    node: str | None = None  # the cluster node's address, set by the Ray actor running it


def stage_spec(pipeline: PipelineConfig, stage_name: str, index: int, *, control_address: str,
               arena_name: str, incarnation: int = 0, dtype: str = "auto",
               log_level: int = logging.INFO, curve: dict[str, str] | None = None,
               data_host: str = "127.0.0.1", encrypt_payloads: bool = True) -> EngineSpec:
    """The spec of replica ``index`` of a stage (KeyError for an unknown stage).
    ``curve``: the launch's keys (a pipeline with replicas on other hosts), for the
    control channel and, with ``encrypt_payloads``, the zmq data sockets; ``data_host``:
    where this host's producers serve payloads to other hosts (a Ray actor sets its own
    node's)."""
    stage = pipeline.stage(stage_name)
    return EngineSpec(
        replica_id=f"{stage.name}/{index}", stage=stage.name, engine=stage.engine,
        control_address=control_address, incarnation=incarnation,
        heartbeat_s=pipeline.heartbeat_s, model=stage.model, model_dir=stage.model_dir,
        device=stage.devices[index % len(stage.devices)], dtype=dtype,
        options={k: v for k, v in stage.options.items() if k != "payload_arena_mb"},
        log_level=log_level, arena_name=arena_name,
        payload_options=payload_options(pipeline, stage_name,
                                        curve if encrypt_payloads else None, data_host),
        memory=stage.memory, memory_share=stage.memory_share,
        # its control channel is CURVE only to another host (local ones use the ipc router)
        curve=curve if stage.placement.remote else None)


def spec_bytes(spec: EngineSpec) -> bytes:
    """The spec as msgpack: how it reaches an engine started with another interpreter
    (omni/runtime/env_process.py), which shares no pickles with the server."""
    return msgspec.msgpack.encode(spec)


def spec_from_bytes(data: bytes) -> EngineSpec:
    """The spec spec_bytes wrote. Fields this omni does not know are dropped and missing
    ones take their defaults: an environment's omni of another version still starts and
    says its wire version in READY, where the server refuses it with the fix."""
    fields = msgspec.msgpack.decode(data)
    if not isinstance(fields, dict):
        raise ValueError(f"an engine spec is a mapping, got {type(fields).__name__}")
    known = {f.name for f in dataclasses.fields(EngineSpec)}
    return EngineSpec(**{k: v for k, v in fields.items() if k in known})


def payload_options(pipeline: PipelineConfig, stage_name: str,
                    curve: dict[str, str] | None = None,
                    data_host: str = "127.0.0.1") -> dict[str, Any]:
    """Where the stage's output payloads go, from its outgoing edges' `connector` and
    from where its consumers run: payloads that cross hosts (this stage or one it feeds
    placed by Ray; the front reads final outputs on the server's host) go through a
    remote backend (`zmq`/`mooncake` when the edges name one, else the faster for the
    size), small ones still inline."""
    stage = pipeline.stage(stage_name)
    edges = [e for e in pipeline.edges if e.src == stage.name]
    kinds = {e.connector for e in edges}
    if stage.final_output:
        kinds.add("auto")  # the front end reads refs of any backend
    named_remote = kinds & {"zmq", "mooncake"}
    crosses = stage.placement.remote or any(pipeline.stage(e.dst).placement.remote
                                            for e in edges)
    remote = (named_remote.pop() if len(named_remote) == 1 else "auto") \
        if crosses or named_remote else None
    put = kinds.pop() if len(kinds) == 1 and kinds <= {"inline", "shm"} else "auto"
    options: dict[str, Any] = {"put": "auto" if remote else put}
    if remote:
        options.update(remote=remote, host=data_host)
    if curve:
        options["curve"] = curve  # zmq data sockets are CURVE servers and clients
    if "payload_arena_mb" in stage.options:
        options["capacity_bytes"] = int(float(stage.options["payload_arena_mb"]) * 2**20)
    return options
