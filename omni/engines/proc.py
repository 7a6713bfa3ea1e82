"""run_engine_process(): any Engine behind one control connection, in its own process.

The main thread owns the engine and the connection and blocks only when it has no work.
Handing messages between reader/writer threads would cost two thread wake-ups per hop,
tens of microseconds each on small VMs, so between steps the main thread reads the socket
itself; only while a step runs does a drainer thread read for it (omni/engines/channel.py
says why). Another thread only watches for the parent's death. The parent owns shutdown:
SIGINT is ignored here (a terminal's Ctrl-C reaches the whole process group), and the
process exits when its parent dies or hangs up.
"""

from __future__ import annotations

import collections
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from omni.config.memory import over_budget
from omni.engines.base import ENGINE_FAULT, Engine, EngineLoadError, EngineRequest
from omni.engines.channel import Channel, OrchestratorGone
from omni.heap import GcPauses, freeze_loaded_objects
from omni.payloads import PayloadPlane
from omni.protocol import Msg, ProtocolError, decode, encode, frame
from omni.transit import InboundTimes

log = logging.getLogger("omni.engine")

LOG_TAIL_LINES = 30


@dataclass(frozen=True)
class EngineSpec:
    """Everything a spawned engine process needs (picklable, plain values)."""

    replica_id: str
    stage: str
    engine: str
    control_path: str  # the orchestrator's Unix socket for this pipeline
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
                         Msg.LIMIT: self._limit, Msg.SHUTDOWN: self._stop}

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
            self.channel.step_begins()  # what arrives meanwhile may be read by a thread
            try:
                outputs = self.engine.step()
            finally:
                self.channel.step_ends()
            self.inbound.step_done(started)
            self._publish(outputs)

    def _handle(self, message: bytes) -> None:
        try:
            kind, body = decode(message)
            handler = self.handlers.get(kind)
            if handler is None:
                raise ProtocolError(f"unexpected {kind.name} from the orchestrator")
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
        self.payloads.drop(request_id)
        self.inbound.drop(request_id)
        self.channel.send(encode(Msg.OUTPUTS, self.replica_id,
                                 [[request_id, None, True, [ENGINE_FAULT, str(exc)]]],
                                 {"sent_at": time.monotonic()}))

    def _abort(self, body: list[Any]) -> None:
        self.engine.abort(body[0])
        for request_id in body[0]:
            self.payloads.drop(request_id)
            self.inbound.drop(request_id)

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
            self.payloads.drop(out.request_id)
            return [out.request_id, None, True, [ENGINE_FAULT, f"cannot publish output: {exc}"]]
        error = None if out.error is None else [out.error_kind, out.error]
        return [out.request_id, data, out.finished, error]


class _TailHandler(logging.Handler):
    """Keeps the last log lines, so a death notice can say what happened before it."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def _exit_with_parent() -> None:
    """Parent gone (even by kill -9) -> exit at once, even in the middle of a long step."""
    parent = multiprocessing.parent_process()
    if parent is not None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(0)


def _setup_logging(spec: EngineSpec) -> _TailHandler:
    fmt = logging.Formatter(f"%(asctime)s %(levelname)s [{spec.replica_id}] %(message)s")
    tail = _TailHandler()
    tail.setFormatter(fmt)
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(fmt)
    root = logging.getLogger()
    root.handlers[:] = [stream, tail]
    root.setLevel(spec.log_level)
    return tail


def run_engine_process(spec: EngineSpec) -> None:
    """Process entry: connect, load the engine, say READY, serve until SHUTDOWN."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tail = _setup_logging(spec)
    threading.Thread(target=_exit_with_parent, daemon=True, name="parent-watch").start()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    code, channel = 0, None
    try:
        sock.connect(spec.control_path)
        channel = Channel(sock, drainer=_option_flag(spec.options, "inbound_drainer", True))
        _serve(spec, channel)
    except OrchestratorGone:
        log.info("orchestrator hung up; exiting")
    except BaseException as exc:  # noqa: BLE001 - any death must be reported
        code = 1
        reason = _death_reason(spec, exc, tail)
        log.error("%s", reason)
        _send_quietly(sock, encode(Msg.DEAD, spec.replica_id, reason))
    finally:
        if channel is not None:
            channel.close()
        sock.close()
    os._exit(code)


def _lower_priority(nice: Any) -> None:
    """Stage option `nice` (0 to 19): this engine process yields the CPU to the others when
    both could run. On a machine with fewer cores than busy stages, an upstream stage that
    keeps generating (a thinker) otherwise takes the CPU from the stages that make the first
    packet (talker, vocoder): bench/results/omni-cpu-nice*.md. Work-conserving: a stage waiting for
    its input leaves the CPU to the one that feeds it, whatever their priorities."""
    if isinstance(nice, bool) or not isinstance(nice, int) or not 0 <= nice <= 19:
        raise EngineLoadError(f"option nice must be an integer from 0 to 19, got {nice!r}")
    if nice:
        os.nice(nice)


def _option_flag(options: dict[str, Any], name: str, default: bool) -> bool:
    value = options.get(name, default)
    if not isinstance(value, bool):
        raise EngineLoadError(f"option {name} must be true or false, got {value!r}")
    return value


def _serve(spec: EngineSpec, channel: Channel) -> None:
    from omni.engines import build_engine

    log.info("loading %s engine for stage '%s'", spec.engine, spec.stage)
    _lower_priority(spec.options.get("nice", 0))
    engine = build_engine(spec)
    payloads = PayloadPlane(spec.arena_name or spec.replica_id.replace("/", "-"),
                            spec.payload_options)
    frozen = freeze_loaded_objects() if _option_flag(spec.options, "gc_freeze", True) else 0
    memory = {**_memory(), "gc_frozen": frozen}
    warning = over_budget(spec.stage, memory.get("cuda_bytes"),
                          getattr(engine, "memory_bytes", None),
                          getattr(engine, "memory_advice", None))
    if warning:
        log.warning("%s", warning)
    channel.send(encode(Msg.READY, spec.replica_id, {**engine.info(), **memory}))
    try:
        EngineLoop(spec.replica_id, engine, channel, payloads).run()
    finally:
        engine.shutdown()
        payloads.close()


def _memory() -> dict[str, int]:
    """What the loaded engine occupies, for READY: host RSS and, if used, GPU memory."""
    memory = {}
    try:
        with open("/proc/self/statm") as statm:
            memory["rss_bytes"] = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        pass
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        memory["cuda_bytes"] = int(torch.cuda.memory_reserved())
    return memory


def _send_quietly(sock: socket.socket, message: bytes) -> None:
    try:
        sock.sendall(frame(message))
    except OSError:
        pass  # the orchestrator is gone too; the exit code is all that is left


def _death_reason(spec: EngineSpec, exc: BaseException, tail: _TailHandler) -> str:
    last = "".join(traceback.format_exception(exc)[-6:]).rstrip()
    logs = "\n".join(list(tail.lines)[-10:])
    return f"{spec.replica_id} died: {type(exc).__name__}: {exc}\n{last}\n-- last log lines --\n{logs}"
