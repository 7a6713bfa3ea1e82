"""StagePool: the replicas of one stage, sticky binding, and balancing."""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing.process
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omni.wire.protocol import identity, parse_identity

if TYPE_CHECKING:
    from omni.config.pipeline import PipelineConfig


@dataclass(eq=False)
class Replica:
    """One engine process serving a stage, as the orchestrator sees it."""

    replica_id: str
    stage: str
    index: int
    process: multiprocessing.process.BaseProcess | None
    ready: asyncio.Future
    alive: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    outstanding: set[str] = field(default_factory=set)  # request ids bound here, not finished
    exit_reason: str | None = None
    connected: bool = False  # its current incarnation said READY (or DEAD) on the ROUTER
    incarnation: int = 0  # +1 per restart: a new DEALER identity (omni/wire/protocol.py)
    last_heartbeat: float = 0.0  # time.monotonic() of its last heartbeat
    restarts: int = 0
    crash_streak: int = 0  # restarts since it last stayed up STABLE_UP_S (restarts.py)
    ready_at: float = 0.0  # time.monotonic() of its current incarnation's READY

    @property
    def identity(self) -> bytes:
        return identity(self.replica_id, self.incarnation)


class NoReplicaError(Exception):
    """Every replica of a stage is down."""


class StagePool:
    """Picks a replica per request: least outstanding work, ties broken round-robin."""

    def __init__(self, stage: str, replicas: list[Replica]) -> None:
        self.stage = stage
        self.replicas = replicas
        self._turn = itertools.count()

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.alive]

    def pick(self, exclude: tuple[Replica, ...] = ()) -> Replica:
        if len(self.replicas) == 1 and self.replicas[0].alive and not exclude:
            return self.replicas[0]  # the common case, without building lists
        live = [r for r in self.live() if r not in exclude]
        if not live:
            raise NoReplicaError(f"stage '{self.stage}' has no live replica")
        start = next(self._turn) % len(live)
        rotated = live[start:] + live[:start]
        return min(rotated, key=lambda r: len(r.outstanding))

    def queue_length(self) -> int:
        return sum(len(r.outstanding) for r in self.replicas)


def external_slot(replicas: Mapping[str, Replica], raw_identity: bytes,
                  pipeline: PipelineConfig) -> Replica | None:
    """The replica slot an external process with this identity may take: one of a
    `launch: external` stage, not connected, and no older than its last incarnation."""
    parsed = parse_identity(raw_identity)
    replica = replicas.get(parsed[0]) if parsed else None
    if (replica is None or replica.connected or parsed[1] < replica.incarnation
            or pipeline.stage(replica.stage).launch != "external"):
        return None
    return replica
