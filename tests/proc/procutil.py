"""Helpers for tests that run real engine processes (spawned, real control sockets).

Imported by the test modules as ``procutil`` (pytest puts tests/proc on sys.path); kept
out of conftest.py because several test directories have a conftest.py of their own.

Every test drives its own pipeline of echo engines through `omni.AsyncOmni` inside
`asyncio.run` (no pytest-asyncio), and checks on the way out that every engine process
exited and the IPC directory is gone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from omni import AsyncOmni
from omni.config.pipeline import PipelineConfig, parse_pipeline
from omni.runtime.orchestrator import OmniOutput
from omni.runtime.pool import Replica
from omni.wire.protocol import Outputs

# a bound that turns a hang into a failure well before pytest-timeout's 120 s, generous
# enough for engine processes spawned on a busy 2-core VM (10 s failed tests that start
# two pipelines there, 2026-12-07)
TEST_TIMEOUT_S = 45.0
ENGINE_LOG_LEVEL = logging.WARNING


def run(coro: Coroutine[Any, Any, Any], timeout_s: float = TEST_TIMEOUT_S) -> Any:
    """Run one test body on a fresh event loop, bounded so a hang fails instead of stalling."""
    async def bounded() -> Any:
        return await asyncio.wait_for(coro, timeout_s)
    return asyncio.run(bounded())


# -- pipelines ---------------------------------------------------------------------------


def echo_stage(name: str, *, final: str | None = None, replicas: int = 1,
               **options: Any) -> dict[str, Any]:
    stage: dict[str, Any] = {"name": name, "engine": "echo", "replicas": replicas,
                             "options": options}
    if final is not None:
        stage["final_output"] = final
    return stage


def make_pipeline(name: str, stages: list[dict[str, Any]],
                  edges: Iterable[tuple[str, str]] = (), **top: Any) -> PipelineConfig:
    data = {"name": name, "stages": stages,
            "edges": [{"from": s, "to": d} for s, d in edges], **top}
    return parse_pipeline(data)


def dag_pipeline(options: Mapping[str, Mapping[str, Any]] | None = None,
                 **top: Any) -> PipelineConfig:
    """a -> b -> c (text) and a -> side (audio), like presets/echo_chain.yaml."""
    opts = options or {}
    return make_pipeline("dag", [
        echo_stage("a", **opts.get("a", {})),
        echo_stage("b", **opts.get("b", {})),
        echo_stage("c", final="text", **opts.get("c", {})),
        echo_stage("side", final="audio", **opts.get("side", {})),
    ], [("a", "b"), ("b", "c"), ("a", "side")], default_modalities=["text"], **top)


def single_pipeline(name: str = "single", *, replicas: int = 1, **top_and_options: Any
                    ) -> PipelineConfig:
    top = {k: top_and_options.pop(k) for k in ("max_inflight", "request_timeout_s")
           if k in top_and_options}
    return make_pipeline(name, [echo_stage("s", final="text", replicas=replicas,
                                           **top_and_options)], **top)


# -- serving -----------------------------------------------------------------------------


@asynccontextmanager
async def serving(pipeline: PipelineConfig, **kwargs: Any) -> AsyncIterator[AsyncOmni]:
    """A started AsyncOmni; on exit it is closed and checked to have left nothing behind."""
    kwargs.setdefault("log_level", ENGINE_LOG_LEVEL)
    omni = AsyncOmni(pipeline, **kwargs)
    await omni.start()
    try:
        yield omni
    finally:
        await omni.close(drain_timeout_s=0)
        assert_stopped(omni)


def replicas_of(omni: AsyncOmni) -> list[Replica]:
    return list(omni.orchestrator.engines.replicas.values())


def assert_stopped(omni: AsyncOmni) -> None:
    """Every engine process exited and was reaped; the IPC directory is removed."""
    for replica in replicas_of(omni):
        assert replica.process.exitcode is not None, f"{replica.replica_id} still running"
    assert not os.path.exists(omni.orchestrator.engines._ipc_dir)


def assert_idle(omni: AsyncOmni) -> None:
    """No request state is left anywhere on the orchestrator side."""
    assert omni.orchestrator.requests == {}
    for replica in replicas_of(omni):
        assert replica.outstanding == set(), (replica.replica_id, replica.outstanding)
    assert omni.health()["in_flight"] == 0


async def collect(agen: AsyncIterator[OmniOutput]) -> list[OmniOutput]:
    return [out async for out in agen]


def chunk_outputs(outputs: list[OmniOutput], stage: str | None = None) -> list[OmniOutput]:
    """The data-carrying outputs (not the closing finished=True one), optionally of a stage."""
    return [o for o in outputs if not o.finished and (stage is None or o.stage == stage)]


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 3.0,
                     what: str = "condition") -> None:
    """Bounded wait for state the test cannot get an event for (e.g. async-gen finalizers)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.005)


# -- observing engine outputs -----------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One request's row in one Outputs message, as the orchestrator received it."""

    replica_id: str
    stage: str
    request_id: str
    data: dict[str, Any] | None
    finished: bool
    error: tuple[str, str] | None  # (kind, message)
    stats: dict[str, Any]


class Tap:
    """Records every Outputs row the orchestrator receives and lets a test await one.

    It wraps EngineGroup.on_report, so it sees exactly what came off the socket,
    including rows the orchestrator then ignores (e.g. for an aborted request).
    """

    def __init__(self, omni: AsyncOmni) -> None:
        group = omni.orchestrator.engines
        self._inner = group.on_report
        group.on_report = self._on_report
        self.rows: list[Row] = []
        self._waiters: list[tuple[Callable[[Row], bool], asyncio.Future]] = []

    def _on_report(self, replica: Replica, report: Any, nbytes: int) -> None:
        # engines see "<client id>#<submit>"; tests speak client ids
        new = [Row(replica.replica_id, replica.stage, row.request_id.rsplit("#", 1)[0],
                   row.data, row.finished, row.error, dict(report.stats))
               for row in report.rows] if isinstance(report, Outputs) else []
        self.rows.extend(new)
        self._inner(replica, report, nbytes)
        for predicate, future in list(self._waiters):
            match = next((r for r in new if predicate(r)), None)
            if match is not None and not future.done():
                future.set_result(match)

    async def first(self, predicate: Callable[[Row], bool], timeout_s: float = 5.0) -> Row:
        """The first row (already seen or future) matching predicate."""
        for row in self.rows:
            if predicate(row):
                return row
        future = asyncio.get_running_loop().create_future()
        entry = (predicate, future)
        self._waiters.append(entry)
        try:
            return await asyncio.wait_for(future, timeout_s)
        finally:
            self._waiters.remove(entry)

    def of(self, request_id: str, stage: str | None = None) -> list[Row]:
        return [r for r in self.rows
                if r.request_id == request_id and (stage is None or r.stage == stage)]
