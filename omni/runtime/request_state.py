"""What the orchestrator keeps per request, and what it hands the client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omni.config.pipeline import Route
from omni.runtime.pool import Replica
from omni.runtime.request_transit import RequestTransit
from omni.runtime.routing import RoutePlan
from omni.session import Session


@dataclass
class OmniOutput:
    """One chunk for the client. The last output of a request has finished=True, no data."""

    request_id: str
    stage: str
    modality: str | None
    data: dict[str, Any] | None
    stage_finished: bool = False
    finished: bool = False
    metrics: dict[str, Any] | None = None


@dataclass(eq=False)
class RequestState:
    request_id: str
    engine_id: str  # unique per submit: a reused client id never gets a stale run's output
    plan: RoutePlan
    inputs: dict[str, Any]
    params: Mapping[str, Mapping[str, Any]]
    queue: asyncio.Queue
    arrived: float = field(default_factory=time.monotonic)
    bound: dict[str, Replica] = field(default_factory=dict)
    chunks: dict[str, list] = field(default_factory=dict)
    times: dict[str, dict[str, float]] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)
    first_output: float | None = None
    deadline: asyncio.TimerHandle | None = None
    finished: bool = False
    seq: dict[tuple[str, str], int] = field(default_factory=dict)  # per stream edge
    held: dict[str, list[list]] = field(default_factory=dict)  # APPENDs before dispatch
    transit: RequestTransit = field(default_factory=RequestTransit)
    lead_outputs: dict[str, int] = field(default_factory=dict)  # omni/runtime/lead.py: per consumer
    lead_limits: dict[str, int | None] = field(default_factory=dict)  # last sent, per producer
    session: Session | None = None  # the session this request is a turn of

    @property
    def route(self) -> Route:
        return self.plan.route
