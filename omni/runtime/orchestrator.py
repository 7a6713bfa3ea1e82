"""The orchestrator: admission, routing along edges, completion, abort, output demux.

It lives on the server's asyncio loop and never touches tensor bytes: engines send
small per-step OUTPUTS messages; for each request the orchestrator forwards finished
producers' chunks to their consumers (full delivery), streams final stages' chunks to
the client's queue, and ends the request when every final stage on its route is done.
Chunks along stream edges, and a client's stream input, go as APPENDs through its
StreamEdges (stream_edges.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from omni.config.pipeline import PipelineConfig
from omni.engines.base import INPUT_FAULT
from omni.errors import (
    AdmissionError,
    DeadlineExceededError,
    DuplicateRequestIdError,
    InvalidInputError,
    OmniError,
    RejectedInputError,
    ReplicaDeadError,
    RequestAbortedError,
    RequestFailedError,
    ServerStoppedError,
    ShuttingDownError,
    StageUnavailableError,
)
from omni.runtime.aborts import AbortFences
from omni.runtime.launcher import EngineGroup, ReplicaUnreachableError
from omni.runtime.lead import LeadControl
from omni.runtime.metrics import Metrics, end_request, observe_durations, pipeline_samples
from omni.runtime.pipeline_sessions import session_stages, stage_params
from omni.runtime.pool import NoReplicaError, Replica
from omni.runtime.request_media import RequestMedia
from omni.runtime.request_state import OmniOutput, RequestState
from omni.runtime.routing import RoutePlan, plan_route
from omni.runtime.stream_edges import StreamEdges
from omni.session import Session
from omni.wire.protocol import AbortAck, Add, Outputs, SessionReply, encode

log = logging.getLogger("omni.runtime.orchestrator")


class Orchestrator:
    """Drives one pipeline's requests across its engine processes."""

    def __init__(self, pipeline: PipelineConfig, *, metrics: Metrics | None = None,
                 dtype: str = "auto", log_level: int = logging.INFO,
                 startup_timeout_s: float = 900.0) -> None:
        self.pipeline = pipeline
        self.metrics = metrics or Metrics()
        self.engines = EngineGroup(pipeline, on_report=self._on_report,
                                   on_death=self._on_death, dtype=dtype, log_level=log_level,
                                   startup_timeout_s=startup_timeout_s)
        self.requests: dict[str, RequestState] = {}  # by client request id
        self._by_engine_id: dict[str, RequestState] = {}
        self._submits = itertools.count()
        self.accepting = False
        self._stopped = False
        self._drain_deadline: float | None = None  # loop time; set by the first drain
        self._idle = asyncio.Event()
        self._idle.set()
        self.metrics.watch(lambda: pipeline_samples(self))
        stages = [s.name for s in pipeline.stages]
        self._measure = self.metrics.for_pipeline(pipeline.name, stages)
        self.control_bytes = {(s, d): 0 for s in stages for d in ("in", "out")}
        self._plans: dict[tuple[Any, ...], RoutePlan] = {}
        self.leads = LeadControl(pipeline)  # stream edges' max_lead (omni/runtime/lead.py)
        self.media = RequestMedia(f"{self.engines.arena_prefix}-media",  # request media
                                  {s.name for s in pipeline.stages if not s.placement.remote})
        # stream edges' APPENDs and the client's stream input (omni/runtime/stream_edges.py)
        self.edges = StreamEdges(self.engines, self.media, self.control_bytes, self._finish)
        self.fences = AbortFences(self.engines.try_send,  # aborts' FREE (runtime/aborts.py)
                                  on_freed=self.media.free)
        self._session_stages = session_stages(pipeline)  # stages keeping session state
        self.on_session_bytes: Callable[[Replica, dict], None] | None = None
        self.on_replica_death: Callable[[Replica], None] | None = None

    async def start(self) -> None:
        await self.engines.start()
        self.accepting = True

    # -- admission ---------------------------------------------------------------------
    def submit(self, inputs: dict[str, Any], modalities: Iterable[str] | None = None,
               params: Mapping[str, Mapping[str, Any]] | None = None,
               request_id: str | None = None, timeout_s: float | None = None,
               view: str | None = None, input_modalities: Iterable[str] | None = None,
               session: Session | None = None, stream_input: bool = False) -> RequestState:
        """Admit a request and dispatch its entry stages; raises OmniError subclasses.
        ``view``: run it on one of the pipeline's views (omni/config/views.py);
        ``input_modalities``: what the inputs hold, to skip entry stages that take none;
        ``session``: a turn of it, on the replicas that hold its state (its pins);
        ``stream_input``: the client sends more input later, through `feed`."""
        if not self.accepting:
            raise ShuttingDownError("server is shutting down; not admitting new requests")
        if len(self.requests) >= self.pipeline.max_inflight:
            raise AdmissionError(f"pipeline '{self.pipeline.name}' has "
                                 f"{self.pipeline.max_inflight} requests in flight; retry later")
        plan = self._plan(view, modalities, input_modalities)
        request_id = request_id or uuid.uuid4().hex
        if request_id in self.requests:
            raise DuplicateRequestIdError(f"request id '{request_id}' is already in flight")
        engine_id = f"{request_id}#{next(self._submits)}"
        state = RequestState(request_id, engine_id, plan, inputs, params or {}, asyncio.Queue(),
                             session=session)
        self.requests[request_id] = state
        self._by_engine_id[engine_id] = state
        self._idle.clear()
        if stream_input:
            self.edges.open_input(state)
        timeout_s = timeout_s or self.pipeline.request_timeout_s
        state.deadline = asyncio.get_running_loop().call_later(timeout_s, self._expire,
                                                               request_id, timeout_s)
        for stage in plan.start:
            self._dispatch(state, stage, plan.start_inputs(stage, inputs, stream_input))
            if state.finished:
                break
        self.leads.flush(self.engines.try_send)
        return state

    def _plan(self, view: str | None, modalities: Iterable[str] | None,
              inputs: Iterable[str] | None) -> RoutePlan:
        source = self.pipeline if view is None else self.pipeline.views[view]
        route = source.route(modalities, inputs)
        key = (view, route.modalities, route.stages)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = plan_route(source, route)
        return plan

    def _dispatch(self, state: RequestState, stage: str, inputs: dict[str, Any]) -> None:
        try:
            params = stage_params(state.plan.params[stage], state, stage,
                                  self._session_stages)
            inputs = self.media.for_stage(stage, state.engine_id, inputs)
            message = encode(Add(state.engine_id, inputs, params, time.monotonic()))
        except AdmissionError as exc:  # the request media buffer is full
            return self._finish(state, exc)
        except (TypeError, ValueError, OverflowError) as exc:
            self._finish(state, InvalidInputError(f"inputs for stage '{stage}' cannot be "
                                                  f"encoded: {exc}"))
            return
        replica = self._send_to_some_replica(state, stage, message)
        if replica is None:
            return
        state.bound[stage] = replica
        replica.outstanding.add(state.engine_id)
        state.times[stage] = {"queued": time.monotonic()}
        self.edges.send_held(state, stage)
        if self.leads and not state.finished:
            self.leads.dispatched(state, stage)

    def _send_to_some_replica(self, state: RequestState, stage: str,
                              message: bytes) -> Replica | None:
        """Pick a replica and send; one that is dying (not yet known dead) is skipped. A
        session's turn goes where its earlier turns went (pinned), or fails."""
        unreachable: tuple[Replica, ...] = ()
        pins = state.session.pins if state.session is not None else None
        while True:
            try:
                replica = pins.get(stage) if pins else None
                if replica is None or not replica.alive or replica in unreachable:
                    if replica is not None:
                        raise NoReplicaError(f"stage '{stage}' replica {replica.replica_id}, "
                                             "which held this session's state, is gone")
                    replica = self.engines.pools[stage].pick(exclude=unreachable)
            except NoReplicaError as exc:
                self._finish(state, StageUnavailableError(str(exc)))
                return None
            try:
                self.control_bytes[stage, "out"] += self.engines.send(replica, message)
                if pins is not None:
                    pins[stage] = replica
                return replica
            except ReplicaUnreachableError:
                unreachable += (replica,)

    # -- engine outputs ----------------------------------------------------------------
    def _on_report(self, replica: Replica, report: Outputs | AbortAck | SessionReply,
                   nbytes: int) -> None:
        self.control_bytes[replica.stage, "in"] += nbytes
        if isinstance(report, AbortAck):
            self.fences.answered(replica, report.request_ids)
            return
        if self.on_session_bytes is not None and "session_bytes" in report.stats:
            self.on_session_bytes(replica, report.stats["session_bytes"])
        if isinstance(report, Outputs):
            self._on_outputs(replica, report)

    def _on_outputs(self, replica: Replica, outputs: Outputs) -> None:
        now, inbound = time.monotonic(), outputs.inbound
        try:  # a bug in the bookkeeping must not cost the outputs below
            observe_durations(self._measure.engine_step[replica.stage], outputs.step_s)
            observe_durations(self._measure.engine_gc_pause[replica.stage], outputs.gc_s)
        except Exception:
            log.exception("%s: its engine stats could not be recorded", replica.replica_id)
        for row in outputs.rows:
            engine_id = row.request_id
            state = self._by_engine_id.get(engine_id)
            if state is not None and state.bound.get(replica.stage) is replica:
                try:
                    state.transit.add_output(replica.stage, outputs.sent_at, now)
                    state.transit.add_inbound(replica.stage, inbound.get(engine_id))
                    self._on_stage_output(state, replica.stage, row.data, row.finished,
                                          row.error, row.error_field)
                except Exception as exc:  # our bug, not the request's: it fails alone,
                    # saying why, instead of waiting forever for an output dropped here
                    log.exception("request %s: handling stage '%s' output raised",
                                  state.request_id, replica.stage)
                    self._finish(state, RequestFailedError(
                        f"internal error handling stage '{replica.stage}' output: "
                        f"{type(exc).__name__}: {exc}", replica.stage))
        self.leads.flush(self.engines.try_send)

    def _on_stage_output(self, state: RequestState, stage: str, data: dict | None,
                         finished: bool, error: tuple[str, str] | None,
                         error_field: str | None = None) -> None:
        now = time.monotonic()
        state.times[stage].setdefault("first_output", now)
        if error is not None:
            kind, message = error
            if kind == INPUT_FAULT:
                self._finish(state, RejectedInputError(
                    f"stage '{stage}' cannot use this input: {message}", stage, error_field))
            else:
                self._finish(state, RequestFailedError(f"stage '{stage}' failed: {message}",
                                                       stage))
            return
        if self.leads:
            self.leads.consumer_output(state, stage, data is not None, finished)
        if stage in state.route.finals:
            state.first_output = state.first_output or now
            modality = state.plan.final_modality[stage]
            state.queue.put_nowait(OmniOutput(state.request_id, stage, modality, data, finished))
        if data is not None and state.plan.full_consumers[stage]:
            state.chunks.setdefault(stage, []).append(data)
        if state.plan.stream_consumers[stage] and (data is not None or finished):
            self.edges.stream(state, stage, data, finished)
            if state.finished:
                return
        if finished:
            self._stage_done(state, stage, now)

    def _stage_done(self, state: RequestState, stage: str, now: float) -> None:
        times = state.times[stage]
        times["finished"] = now
        self._measure.stage_latency[stage].observe(now - times["queued"])
        state.done.add(stage)
        state.bound[stage].outstanding.discard(state.engine_id)
        plan = state.plan
        for consumer in plan.full_consumers[stage]:
            producers = plan.full_producers[consumer]
            if consumer not in state.bound and all(p in state.done for p in producers):
                self._dispatch(state, consumer, plan.ready_inputs(consumer, state.chunks,
                                                                  state.inputs))
                if state.finished:
                    return
                self._free_delivered(state, producers)
        if plan.route.finals <= state.done:
            self._finish(state, None)

    @staticmethod
    def _free_delivered(state: RequestState, producers: tuple[str, ...]) -> None:
        """Drop a producer's chunks once every full consumer of it has been dispatched."""
        for producer in producers:
            if all(c in state.bound for c in state.plan.full_consumers[producer]):
                state.chunks.pop(producer, None)

    def feed(self, request_id: str, data: dict[str, Any], last: bool = False) -> None:
        """More input of a ``stream_input`` request, for its entry stages
        (stream_edges.py); ``last`` ends it."""
        self.edges.feed(self.requests.get(request_id), request_id, data, last)

    # -- ending ------------------------------------------------------------------------
    def abort(self, request_id: str, reason: str = "aborted by the client") -> bool:
        """Abort a request at every stage it is running on; False if it is not in flight."""
        state = self.requests.get(request_id)
        if state is None:
            return False
        self._finish(state, RequestAbortedError(reason))
        return True

    def _expire(self, request_id: str, timeout_s: float) -> None:
        state = self.requests.get(request_id)
        if state is not None:
            self._finish(state, DeadlineExceededError(
                f"request {request_id} exceeded its deadline of {timeout_s:g} s"))

    def _on_death(self, replica: Replica, reason: str) -> None:
        for engine_id in list(replica.outstanding):
            state = self._by_engine_id.get(engine_id)
            if state is not None:
                self._finish(state, ReplicaDeadError(
                    f"stage '{replica.stage}' replica {replica.replica_id} died while serving "
                    f"this request: {reason.splitlines()[0]}", replica.stage))
        replica.outstanding.clear()
        self.fences.died(replica)
        if self.on_replica_death is not None:
            self.on_replica_death(replica)

    def _finish(self, state: RequestState, error: OmniError | None) -> None:
        if state.finished:
            return
        state.finished = True
        self.edges.close_input(state)
        if state.deadline is not None:
            state.deadline.cancel()
        self._release_stages(state, failed=error is not None)
        del self.requests[state.request_id]
        del self._by_engine_id[state.engine_id]
        if not self.requests:
            self._idle.set()
        timings = end_request(self._measure, state,
                              "ok" if error is None else type(error).__name__)
        if error is not None:
            log.info("request %s ended: %s", state.request_id, error)
            state.queue.put_nowait(error)
        else:
            state.queue.put_nowait(OmniOutput(state.request_id, "", None, None, True, True,
                                              timings))

    def _release_stages(self, state: RequestState, failed: bool) -> None:
        """Abort the request where it still runs; after a failure also where it finished,
        so producers free payloads whose refs the orchestrator is dropping."""
        self.fences.abort(state.engine_id, [  # and FREE once they all let go (aborts.py)
            replica for stage, replica in state.bound.items() if failed or (
                stage not in state.done and state.engine_id in replica.outstanding)])
        for replica in state.bound.values():
            replica.outstanding.discard(state.engine_id)
        state.chunks.clear()
        state.held.clear()

    # -- lifecycle and health ----------------------------------------------------------
    def health(self) -> dict[str, Any]:
        stages = {name: {"live": len(pool.live()), "replicas": len(pool.replicas),
                         "restarts": sum(r.restarts for r in pool.replicas)}
                  for name, pool in self.engines.pools.items()}
        healthy = self.accepting and all(s["live"] > 0 for s in stages.values())
        return {"healthy": healthy, "stages": stages, "in_flight": len(self.requests)}

    async def drain(self, timeout_s: float) -> None:
        """Stop admitting, wait for in-flight requests until the drain's deadline, then
        abort those still running (ServerStoppedError). One deadline for every call: the
        earliest asked for, so stop() after the server's own drain never waits again."""
        self.accepting = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if self._drain_deadline is None or deadline < self._drain_deadline:
            self._drain_deadline = deadline
        if not self.requests:
            return
        left = max(0.0, self._drain_deadline - loop.time())
        log.info("pipeline '%s': draining %d requests (up to %.3g s)", self.pipeline.name,
                 len(self.requests), left)
        try:
            await asyncio.wait_for(self._idle.wait(), left)
        except TimeoutError:
            log.warning("pipeline '%s': %d requests still running at the drain deadline; "
                        "aborting them", self.pipeline.name, len(self.requests))
            for state in list(self.requests.values()):
                self._finish(state, ServerStoppedError(
                    "the server shut down before this request finished (its drain deadline "
                    "passed); send it again"))

    async def stop(self, drain_timeout_s: float = 30.0) -> None:
        """Drain (aborting what is left at the deadline), then stop every engine process.
        Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        await self.drain(drain_timeout_s)
        await self.engines.stop()
        self.media.close()
