"""EngineLoop: feeds an engine from its control channel and publishes its step outputs.

The main thread owns the engine and the channel and blocks only when it has no work; it
reads between steps. While a step runs, libzmq's I/O thread receives for it, so what
arrives meanwhile is queued in the process, not behind a full socket buffer.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from omni.engines.base import ENGINE_FAULT, Engine, EngineRequest
from omni.engines.proc.channel import Channel
from omni.heap import GcPauses
from omni.wire.payloads import PayloadPlane
from omni.wire.protocol import Msg, ProtocolError, check_inbound, decode, encode
from omni.wire.transit import InboundTimes

log = logging.getLogger("omni.engine")


class EngineLoop:
    """Feeds an engine from the connection and publishes its step outputs."""

    def __init__(self, replica_id: str, engine: Engine, channel: Channel,
                 payloads: PayloadPlane) -> None:
        self.replica_id = replica_id
        self.engine = engine
        self.channel = channel
        self.payloads = payloads
        self.running = True
        self.inbound = InboundTimes()
        self.gc_pauses: GcPauses | None = None  # while run() runs: it registers and removes
        self.handlers = {Msg.ADD: self._add, Msg.APPEND: self._append, Msg.ABORT: self._abort,
                         Msg.FREE: self._free,
                         Msg.LIMIT: self._limit, Msg.SESSION: self._session,
                         Msg.SHUTDOWN: self._stop}

    def run(self) -> None:
        self.gc_pauses = GcPauses()
        try:
            while self.running:
                self._once()
        finally:
            self.gc_pauses.close()
            self.gc_pauses = None

    def _once(self) -> None:
        """Handle what came in, then run one step if there is work."""
        messages = self.channel.receive(block=not self.engine.has_work())
        for message in messages:
            self._handle(message)
        if messages and self.running:
            # what arrived while those were handled joins this step: a producer that
            # finishes a batch sends its requests one message each, and the first to
            # wake an idle engine left the rest a whole step behind it (code2wav with
            # full delivery, bench/results/omni.md); one look, so a steady inflow
            # cannot hold the step back
            for message in self.channel.receive(block=False):
                self._handle(message)
        if self.running and self.engine.has_work():
            started = time.monotonic()
            outputs = self.engine.step()
            self.inbound.step_done(started)
            self._publish(outputs)

    def _handle(self, message: bytes) -> None:
        try:
            kind, body = decode(message)
            handler = self.handlers.get(kind)
            if handler is None:
                raise ProtocolError(f"unexpected {kind.name} from the orchestrator")
            check_inbound(kind, body)
        except ProtocolError as exc:
            log.error("dropping malformed message from orchestrator: %s", exc)
            return
        handler(body)

    def _add(self, body: list[Any]) -> None:
        request_id, inputs, params, sent_at = body
        self.inbound.received(request_id, sent_at)
        try:
            inputs = self.payloads.resolve(request_id, inputs)
            self.engine.add(EngineRequest(request_id, inputs, params))
        except Exception as exc:  # a bad request fails alone, the engine keeps serving
            self._reject(request_id, exc)

    def _append(self, body: list[Any]) -> None:
        request_id, producer, seq, data, last, sent_at = body
        self.inbound.received(request_id, sent_at)
        try:
            data = self.payloads.resolve(request_id, data)
            self.engine.append(request_id, producer, seq, data, last)
        except Exception as exc:
            self.engine.abort([request_id])
            self._reject(request_id, exc)

    def _reject(self, request_id: str, exc: Exception) -> None:
        log.warning("request %s failed: %s", request_id, exc)
        self.payloads.forget(request_id)  # what it made is freed after the abort (FREE)
        self.inbound.drop(request_id)
        self.channel.send(encode(Msg.OUTPUTS, self.replica_id,
                                 [[request_id, None, True, [ENGINE_FAULT, str(exc)]]],
                                 {"sent_at": time.monotonic()}))

    def _abort(self, body: list[Any]) -> None:
        """Drop the requests, then say so: the engine reads none of their inputs after this
        (their producers free them once every replica has said it; omni/wire/payloads.py)."""
        self.engine.abort(body[0])
        for request_id in body[0]:
            self.payloads.forget(request_id)
            self.inbound.drop(request_id)
        self.channel.send(encode(Msg.OUTPUTS, self.replica_id, [],
                                 {"aborted": body[0], "sent_at": time.monotonic()}))

    def _free(self, body: list[Any]) -> None:
        for request_id in body[0]:
            self.payloads.free(request_id)

    def _limit(self, body: list[Any]) -> None:
        try:
            limits = {rid: n for rid, n in body[0]}
            if not all(n is None or (isinstance(n, int) and not isinstance(n, bool))
                       for n in limits.values()):
                raise ValueError(f"limits must be integers or None, got {limits}")
        except (TypeError, ValueError) as exc:
            log.error("dropping malformed LIMIT from orchestrator: %s", exc)
            return
        self.engine.limit(limits)

    def _session(self, body: list[Any]) -> None:
        """Drop sessions' engine state, then say what is held now (stats only)."""
        try:
            ends = [(str(session), str(op)) for session, op in body[0]]
        except (TypeError, ValueError) as exc:
            log.error("dropping malformed SESSION from orchestrator: %s", exc)
            return
        for session, op in ends:
            self.engine.end_session(session, op)
        stats = self.engine.stats()
        stats["sent_at"] = time.monotonic()
        self.channel.send(encode(Msg.OUTPUTS, self.replica_id, [], stats))

    def _stop(self, body: list[Any]) -> None:
        self.running = False

    def _publish(self, outputs: list) -> None:
        if not outputs:
            return
        rows = []
        for out in outputs:
            rows.append(self._row(out))
            if out.finished:
                self.payloads.done(out.request_id)
        stats = self.engine.stats()
        stats.update(self.payloads.stats())
        stats["inbound"] = self.inbound.take(row[0] for row in rows)
        stats["step_s"] = self.inbound.take_steps()
        stats["gc_s"] = self.gc_pauses.take() if self.gc_pauses else []
        stats["sent_at"] = time.monotonic()
        self.channel.send(encode(Msg.OUTPUTS, self.replica_id, rows, stats))

    def _row(self, out: Any) -> list:
        try:
            data = self.payloads.publish(out.request_id, out.data)
        except Exception as exc:  # e.g. the arena stayed full: this request fails alone
            self.engine.abort([out.request_id])
            self.payloads.forget(out.request_id)
            return [out.request_id, None, True, [ENGINE_FAULT, f"cannot publish output: {exc}"]]
        error = None if out.error is None else [out.error_kind, out.error]
        return [out.request_id, data, out.finished, error]
