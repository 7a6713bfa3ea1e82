"""The orchestrator's side of sessions: one SessionManager per pipeline, wired to engines.

- engines report the bytes they hold per session in their stats (``session_bytes``);
  the manager adds them up and, over the budget, evicts the least recently used
  session's state: an EndSessions message to each replica the session is pinned to;
- closing (or resetting) a session tells those replicas the same way, so engine state is
  freed on every way out: close, idle lease, resume grace, eviction, shutdown;
- a replica that dies ends every session whose state lived there (the client gets an
  error, never a hang): what it held is gone, and a conversation that silently lost its
  state could not keep the promises its fences make;
- a timer reaps sessions whose lease ran out (leases are timers, not synchronisation).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from omni.config.pipeline import PipelineConfig
from omni.engines.kinds import STATEFUL_KINDS
from omni.runtime.pool import Replica
from omni.session import Session, SessionManager
from omni.wire.protocol import EndSessions, encode

log = logging.getLogger("omni.runtime.pipeline_sessions")

DEFAULT_KV_SHARE = 0.5  # of the AR stages' KV caches, when no state_budget_mb is set
REAP_EVERY_S = 1.0  # the most a lease can outlive its deadline


def stage_params(defaults: dict[str, Any], state: Any, stage: str,
                 keeping: set[str]) -> dict[str, Any]:
    """A request's params for one stage: the stage's defaults, then the request's "*" and
    per-stage params; a session's id for the stages that keep its state (``keeping``)."""
    if not state.params and state.session is None:
        return defaults  # only read (encoded), never changed
    merged = dict(defaults)
    merged.update(state.params.get("*", {}))
    merged.update(state.params.get(stage, {}))
    if state.session is not None and stage in keeping:
        merged["session"] = state.session.id  # its engine keeps the session's state
    return merged


def session_stages(pipeline: PipelineConfig) -> set[str]:
    return {s.name for s in pipeline.stages if s.engine in STATEFUL_KINDS}


class PipelineSessions:
    """Sessions of one pipeline, on one orchestrator's engines."""

    def __init__(self, pipeline: PipelineConfig, orchestrator: Any) -> None:
        settings = pipeline.sessions
        self.orchestrator = orchestrator
        budget = settings.state_budget_mb
        self.manager = SessionManager(
            max_sessions=settings.max_sessions, idle_ttl_s=settings.idle_ttl_s,
            resume_grace_s=settings.resume_grace_s,
            byte_budget=None if budget is None else int(budget * 2**20),
            on_evict=lambda s: self._tell_engines(s, "evict"))
        self._budget_from_engines = budget is None
        orchestrator.on_session_bytes = self._bytes_reported
        orchestrator.on_replica_death = self._replica_died
        orchestrator.metrics.watch(self._samples)
        self._reaper: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """After the engines started: the default budget comes from their KV caches."""
        if self._budget_from_engines:
            kv = sum(r.info.get("kv_blocks", 0) * r.info.get("kv_block_bytes", 0)
                     for r in self.orchestrator.engines.replicas.values())
            self.manager.byte_budget = int(kv * DEFAULT_KV_SHARE) or None
        self._schedule_reap()

    def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        self.manager.close_all("the server is shutting down")

    def open(self, kind: str, params: dict[str, Any] | None = None) -> Session:
        session = self.manager.open(kind, params)
        session.on_end.append(lambda s, reason: self._tell_engines(s, "close"))
        log.info("session %s (%s) opened; %d open", session.id, kind, len(self.manager))
        return session

    # -- engines -----------------------------------------------------------------------
    def _tell_engines(self, session: Session, op: str) -> None:
        message = encode(EndSessions([(session.id, op)]))
        for replica in session.pins.values():
            if replica.alive:
                self.orchestrator.engines.try_send(replica, message)

    def _bytes_reported(self, replica: Replica, by_session: Any) -> None:
        if not isinstance(by_session, dict):
            return
        for session_id in self.manager.report_bytes(replica.replica_id, by_session):
            log.info("session %s: engine state evicted (over the %d-byte session budget)",
                     session_id, self.manager.byte_budget)

    def _replica_died(self, replica: Replica) -> None:
        self.manager.forget_holder(replica.replica_id)
        for session in list(self.manager.sessions.values()):
            if any(r is replica for r in session.pins.values()):
                self.manager.close(session.id, f"stage '{replica.stage}' replica "
                                   f"{replica.replica_id}, which held this session, died")

    def _samples(self) -> Any:
        m, labels = self.manager, {"pipeline": self.orchestrator.pipeline.name}
        yield "gauge", "omni_sessions_open", "Sessions open (attached or awaiting a resume)", \
            labels, len(m)
        yield "gauge", "omni_session_state_bytes", "Engine state held for sessions (KV)", \
            labels, m.held_bytes
        yield "gauge", "omni_session_state_budget_bytes", "Session state budget; over it the " \
            "least recently used session's state is dropped", labels, m.byte_budget or 0
        yield "counter", "omni_session_evictions", "Sessions whose engine state was dropped " \
            "to fit the budget", labels, m.evictions

    # -- leases ------------------------------------------------------------------------
    def _schedule_reap(self) -> None:
        settings = self.manager
        every = max(0.05, min(REAP_EVERY_S, settings.idle_ttl_s / 4,
                              settings.resume_grace_s / 4 or REAP_EVERY_S))
        self._reaper = asyncio.get_running_loop().call_later(every, self._reap)

    def _reap(self) -> None:
        for session_id in self.manager.reap():
            log.info("session %s closed: its lease ran out", session_id)
        self._schedule_reap()
