"""run_engine_process(): any Engine behind DEALER/PUSH sockets, in its own process.

Threads: one reads the DEALER (requests) into an inbox, one drains an outbox into the
PUSH (results); the main thread owns the engine and blocks only when it has no work.
The parent owns shutdown: SIGINT is ignored here (a terminal's Ctrl-C reaches the whole
process group), and the process exits by itself when its parent dies.
"""

from __future__ import annotations

import collections
import logging
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import sys
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any

import zmq

from omni.engines.base import Engine, EngineRequest
from omni.protocol import Endpoints, Msg, ProtocolError, decode, encode

log = logging.getLogger("omni.engine")

DEAD_LINGER_MS = 3000  # long enough for the DEAD notice to reach the orchestrator
LOG_TAIL_LINES = 30


@dataclass(frozen=True)
class EngineSpec:
    """Everything a spawned engine process needs (picklable, plain values)."""

    replica_id: str
    stage: str
    engine: str
    endpoints: Endpoints
    model: str | None = None
    model_dir: str | None = None
    device: str = "cpu"
    dtype: str = "auto"
    options: dict[str, Any] = field(default_factory=dict)
    log_level: int = logging.INFO


class _TailHandler(logging.Handler):
    """Keeps the last log lines, so a death notice can say what happened before it."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


class EngineLoop:
    """Feeds an engine from the inbox and publishes its step outputs."""

    def __init__(self, replica_id: str, engine: Engine, outbox: queue.Queue) -> None:
        self.replica_id = replica_id
        self.engine = engine
        self.inbox: queue.Queue = queue.Queue()
        self.outbox = outbox
        self.running = True
        self.handlers = {Msg.ADD: self._add, Msg.ABORT: self._abort, Msg.SHUTDOWN: self._stop}

    def run(self) -> None:
        while self.running:
            if not self.engine.has_work():
                self._handle(self.inbox.get())  # idle: block until something arrives
            self._drain()
            if self.running and self.engine.has_work():
                self._publish(self.engine.step())

    def _drain(self) -> None:
        while self.running:
            try:
                self._handle(self.inbox.get_nowait())
            except queue.Empty:
                return

    def _handle(self, message: tuple[Msg, list[Any]]) -> None:
        kind, body = message
        self.handlers[kind](body)

    def _add(self, body: list[Any]) -> None:
        request_id, inputs, params = body
        try:
            self.engine.add(EngineRequest(request_id, inputs, params))
        except Exception as exc:  # a bad request fails alone, the engine keeps serving
            log.warning("request %s rejected: %s", request_id, exc)
            self.outbox.put(encode(Msg.OUTPUTS, self.replica_id,
                                   [[request_id, None, True, str(exc)]], {}))

    def _abort(self, body: list[Any]) -> None:
        self.engine.abort(body[0])

    def _stop(self, body: list[Any]) -> None:
        self.running = False

    def _publish(self, outputs: list) -> None:
        if outputs:
            rows = [[o.request_id, o.data, o.finished, o.error] for o in outputs]
            self.outbox.put(encode(Msg.OUTPUTS, self.replica_id, rows, self.engine.stats()))


def _read_requests(dealer: zmq.Socket, inbox: queue.Queue) -> None:
    """Owns the DEALER once started: closes it on SHUTDOWN or when ctx.term() interrupts."""
    try:
        while True:
            try:
                message = decode(dealer.recv_multipart())
            except ProtocolError as exc:
                log.error("dropping malformed message from orchestrator: %s", exc)
                continue
            inbox.put(message)
            if message[0] == Msg.SHUTDOWN:
                return
    except zmq.ZMQError:
        return  # ETERM: the process is exiting
    finally:
        dealer.close()


def _write_results(push: zmq.Socket, outbox: queue.Queue) -> None:
    while (frames := outbox.get()) is not None:
        push.send_multipart(frames)


def _exit_with_parent() -> None:
    """Parent gone (even by kill -9) -> exit at once; nobody is left to serve."""
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
    ctx = zmq.Context(io_threads=1)
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 0)  # admission in the orchestrator bounds what is in flight
    push.connect(spec.endpoints.results)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, spec.replica_id.encode())
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(spec.endpoints.requests)
    outbox: queue.Queue = queue.Queue()
    writer = threading.Thread(target=_write_results, args=(push, outbox), name="results-out")
    writer.start()
    code = 0
    reader: list[threading.Thread] = []
    try:
        _serve(spec, dealer, outbox, reader)
    except BaseException as exc:  # noqa: BLE001 - any death must be reported
        code = 1
        reason = _death_reason(spec, exc, tail)
        log.error("%s", reason)
        outbox.put(encode(Msg.DEAD, spec.replica_id, reason))
    finally:
        outbox.put(None)
        writer.join()
        push.setsockopt(zmq.LINGER, DEAD_LINGER_MS)
        push.close()
        if not reader:
            dealer.close()
        ctx.term()  # waits for the DEAD notice to flush (linger) and the reader to close
    os._exit(code)


def _serve(spec: EngineSpec, dealer: zmq.Socket, outbox: queue.Queue,
           reader: list[threading.Thread]) -> None:
    from omni.engines import build_engine

    log.info("loading %s engine for stage '%s'", spec.engine, spec.stage)
    engine = build_engine(spec)
    loop = EngineLoop(spec.replica_id, engine, outbox)
    dealer.send_multipart(encode(Msg.READY, spec.replica_id, engine.info()))
    reader.append(threading.Thread(target=_read_requests, args=(dealer, loop.inbox),
                                   daemon=True, name="requests-in"))
    reader[0].start()
    try:
        loop.run()
    finally:
        engine.shutdown()


def _death_reason(spec: EngineSpec, exc: BaseException, tail: _TailHandler) -> str:
    last = "".join(traceback.format_exception(exc)[-6:]).rstrip()
    logs = "\n".join(list(tail.lines)[-10:])
    return f"{spec.replica_id} died: {type(exc).__name__}: {exc}\n{last}\n-- last log lines --\n{logs}"
