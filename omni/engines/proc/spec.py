"""EngineSpec: everything an engine process needs, built from a pipeline's stage.

One builder for both ways a replica starts: forked by the launcher, or started by
something else with `python -m omni.engines.proc` (its own host, its own supervisor).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

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


def stage_spec(pipeline: PipelineConfig, stage_name: str, index: int, *, control_address: str,
               arena_name: str, incarnation: int = 0, dtype: str = "auto",
               log_level: int = logging.INFO) -> EngineSpec:
    """The spec of replica ``index`` of a stage (KeyError for an unknown stage)."""
    stage = pipeline.stage(stage_name)
    return EngineSpec(
        replica_id=f"{stage.name}/{index}", stage=stage.name, engine=stage.engine,
        control_address=control_address, incarnation=incarnation,
        heartbeat_s=pipeline.heartbeat_s, model=stage.model, model_dir=stage.model_dir,
        device=stage.devices[index % len(stage.devices)], dtype=dtype,
        options={k: v for k, v in stage.options.items() if k != "payload_arena_mb"},
        log_level=log_level, arena_name=arena_name,
        payload_options=payload_options(pipeline, stage_name), memory=stage.memory,
        memory_share=stage.memory_share)


def payload_options(pipeline: PipelineConfig, stage_name: str) -> dict[str, Any]:
    """Where the stage's output payloads go, from its outgoing edges' `connector`."""
    stage = pipeline.stage(stage_name)
    kinds = {e.connector for e in pipeline.edges if e.src == stage.name}
    if stage.final_output:
        kinds.add("auto")  # the front end reads refs of any backend
    put = kinds.pop() if len(kinds) == 1 and kinds <= {"inline", "shm"} else "auto"
    options: dict[str, Any] = {"put": put}
    if "payload_arena_mb" in stage.options:
        options["capacity_bytes"] = int(float(stage.options["payload_arena_mb"]) * 2**20)
    return options
