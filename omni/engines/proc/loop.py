"""EngineLoop: feeds an engine from its control channel and publishes its step outputs.

The main thread owns the engine and the channel and blocks only when it has no work; it
reads between steps. While a step runs, libzmq's I/O thread receives for it, so what
arrives meanwhile is queued in the process, not behind a full socket buffer.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from omni.connector.base import ArenaFullError
from omni.engines.base import ENGINE_FAULT, Engine, EngineRequest
from omni.engines.proc.channel import Channel
from omni.heap import GcPauses
from omni.wire.payloads import PayloadPlane
from omni.wire.protocol import (
    Abort,
    AbortAck,
    Add,
    Append,
    EndSessions,
    Free,
    Limit,
    Outputs,
    ProtocolError,
    Row,
    SessionReply,
    Shutdown,
    decode_command,
    encode,
)
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
        self.handlers = {Add: self._add, Append: self._append, Abort: self._abort,
                         Free: self._free, Limit: self._limit, EndSessions: self._end_sessions,
                         Shutdown: self._stop}

    def run(self) -> None:
        self.gc_pauses = GcPauses()
        try:
            while self.running:
                self._once()
        finally:
            self.gc_pauses.close()
            self.gc_pauses = None

    def _once(self) -> None:
        """Handle what came in, then run one step if there is work (unless the engine
        gathers a batch: then the next round waits on the socket for the rest of it)."""
        work = self.engine.has_work()
        messages = self.channel.receive(block=not work,
                                        wait_s=self.engine.gather_s() if work else 0.0)
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
        if self.running and self.engine.has_work() and not self.engine.gather_s():
            started = time.monotonic()
            outputs = self.engine.step()
            self.inbound.step_done(started)
            # a step that ends the work without an output (with overlapped steps: the
            # one after an abort, which drops the aborted rows) still says the freed KV
            # blocks and queue: no later step would carry them to /metrics
            self._publish(outputs, stats_only=not self.engine.has_work())

    def _handle(self, message: bytes) -> None:
        try:
            command = decode_command(message)  # typed and checked: handlers trust it
        except ProtocolError as exc:
            log.error("dropping malformed message from orchestrator: %s", exc)
            return
        self.handlers[type(command)](command)

    def _add(self, add: Add) -> None:
        request_id = add.request_id
        self.inbound.received(request_id, add.sent_at)
        try:
            inputs = self.payloads.resolve(request_id, add.inputs)
            self.engine.add(EngineRequest(request_id, inputs, add.params))
        except Exception as exc:  # a bad request fails alone, the engine keeps serving
            self._reject(request_id, exc)

    def _append(self, append: Append) -> None:
        request_id = append.request_id
        self.inbound.received(request_id, append.sent_at)
        try:
            data = self.payloads.resolve(request_id, append.data)
            self.engine.append(request_id, append.producer, append.seq, data, append.last)
        except Exception as exc:
            self.engine.abort([request_id])
            self._reject(request_id, exc)

    def _reject(self, request_id: str, exc: Exception) -> None:
        log.warning("request %s failed: %s", request_id, exc)
        self.payloads.forget(request_id)  # what it made is freed after the abort (Free)
        self.inbound.drop(request_id)
        error = (ENGINE_FAULT, str(exc))
        self.channel.send(encode(Outputs(self.replica_id, [Row(request_id, None, True, error)],
                                         time.monotonic())))

    def _abort(self, abort: Abort) -> None:
        """Drop the requests, then say so: the engine reads none of their inputs after this
        (their producers free them once every replica has said it; omni/wire/payloads.py)."""
        self.engine.abort(abort.request_ids)
        for request_id in abort.request_ids:
            self.payloads.forget(request_id)
            self.inbound.drop(request_id)
        self.channel.send(encode(AbortAck(self.replica_id, abort.request_ids,
                                          time.monotonic())))
        if not self.engine.has_work():  # no step will carry the freed KV blocks and
            self._publish([], stats_only=True)  # queue to /metrics: say them now

    def _free(self, free: Free) -> None:
        for request_id in free.request_ids:
            self.payloads.free(request_id)

    def _limit(self, limit: Limit) -> None:
        self.engine.limit(limit.limits)

    def _end_sessions(self, end: EndSessions) -> None:
        """Drop sessions' engine state, then say what is held now."""
        for session, op in end.ends:
            self.engine.end_session(session, op)
        self.channel.send(encode(SessionReply(self.replica_id, self.engine.stats(),
                                              time.monotonic())))

    def _stop(self, shutdown: Shutdown) -> None:
        self.running = False

    def _publish(self, outputs: list, stats_only: bool = False) -> None:
        if not outputs and not stats_only:
            return
        rows: list[Row] = []
        for out in outputs:
            rows.append(self._row(out, rows))
            if out.finished:
                self.payloads.done(out.request_id)
        self._send(rows)

    def _send(self, rows: list[Row]) -> None:
        """One Outputs message: these rows, the engine's stats, what came in meanwhile."""
        stats = self.engine.stats()
        stats.update(self.payloads.stats())
        inbound = self.inbound.take(row.request_id for row in rows)
        steps = self.inbound.take_steps()
        gc_pauses = self.gc_pauses.take() if self.gc_pauses else []
        self.channel.send(encode(Outputs(self.replica_id, rows, time.monotonic(), stats,
                                         inbound, steps, gc_pauses)))

    def _row(self, out: Any, pending: list[Row]) -> Row:
        try:
            data = self._published(out, pending)
        except Exception as exc:  # e.g. the arena stayed full: this request fails alone
            self.engine.abort([out.request_id])
            self.payloads.forget(out.request_id)
            return Row(out.request_id, None, True,
                       (ENGINE_FAULT, f"cannot publish output: {exc}"))
        error = None if out.error is None else (out.error_kind, out.error)
        return Row(out.request_id, data, out.finished, error, out.error_field)

    def _published(self, out: Any, pending: list[Row]) -> Any:
        """out.data with its tensors in the connector. When the storage is full and this
        step's earlier rows hold payloads, their readers learn of them only from the
        Outputs message: without waiting, send those rows now (`pending` is emptied), then
        wait for room. Waiting with them unsent could only time out: four 832x480x33
        videos of one step, 40 MB each, in a 64 MiB arena failed three of them after 5 s
        each."""
        placed: dict[str, list] = {}  # what the try put stays put for the wait
        if pending:
            try:
                return self.payloads.publish(out.request_id, out.data, timeout_s=0.0,
                                             placed=placed)
            except ArenaFullError:
                self._send(list(pending))
                pending.clear()
        return self.payloads.publish(out.request_id, out.data, placed=placed)
