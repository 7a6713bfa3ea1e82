"""The baselines ours is compared with, each one request at a time from a sync client.

  A   in-process: N EchoEngines chained in this process, no sockets -> the engine work.
  B0  Unix socket floor: a listening Unix stream socket here, a spawned child that
      connects and echoes with a bare loop; omni.protocol framing (length + type byte +
      msgpack array) both ways -> the floor of omni's transport, no engine loop.
  B   ZeroMQ floor (reference): ROUTER + PULL here, DEALER + PUSH in a spawned child,
      ipc, single-frame messages with the type byte first -> what the runtime paid when
      its control plane was ZeroMQ (libzmq I/O threads on both sides).
  B2  the real engine process: the same client as B0 against `run_engine_process` with an
      EchoEngine, the transport the orchestrator uses -> B0 plus the engine's loop.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import shutil
import socket
import tempfile
import time
import uuid
from typing import Any

import msgpack
import zmq

from bench.common import PROMPT, progress, say, summarize
from omni.protocol import FrameReader, Msg, decode, encode, frame

REPLICA_ID = "s0/0"
RECV_BYTES = 1 << 20
CONNECT_TIMEOUT_S = 60.0


# -- A: the echo engine in-process -----------------------------------------------------------
def bench_inprocess(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """N EchoEngines chained in this process: the engine work of an N-stage request."""
    from omni.engines.base import EngineRequest
    from omni.engines.echo.engine import EchoEngine

    names = [f"s{i}" for i in range(n)]
    engines = [EchoEngine(name) for name in names]
    samples: list[int] = []
    clock = time.perf_counter_ns
    for i in range(args.warmup + args.requests):
        rid = uuid.uuid4().hex
        t0 = clock()
        inputs: dict[str, Any] = {"prompt": PROMPT}
        for name, engine in zip(names, engines, strict=True):
            engine.add(EngineRequest(rid, inputs, {}))
            chunks = []
            while engine.has_work():
                chunks.extend(o.data for o in engine.step())
            inputs = {name: chunks}
        t1 = clock()
        if i >= args.warmup:
            samples.append(t1 - t0)
    assert inputs[names[-1]][0]["trace"] == names, inputs
    stats = summarize(samples)
    say(f"[A in-process N={n}] p50 {stats['p50_us']:.1f} us  p99 {stats['p99_us']:.1f} us")
    return stats


# -- B0 / B2: omni's transport, a Unix stream socket -----------------------------------------
def _bare_echo_child(path: str) -> None:
    """B0's child: connect, READY, then answer each ADD with one OUTPUTS; no engine."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    reader = FrameReader()
    sock.sendall(frame(encode(Msg.READY, REPLICA_ID, {"engine": "bare"})))
    while True:
        data = sock.recv(RECV_BYTES)
        if not data:
            break
        for message in reader.feed(data):
            kind, body = decode(message)
            if kind == Msg.SHUTDOWN:
                sock.close()
                return
            rid, inputs = body[0], body[1]  # ADD: id, inputs, params, sent_at
            row = [rid, {"text": inputs["prompt"], "trace": ["s0"], "index": 0}, True, None]
            sock.sendall(frame(encode(Msg.OUTPUTS, REPLICA_ID, [row], {"running": 0})))
    sock.close()


class UnixServer:
    """The orchestrator's side of one control connection, as plain blocking calls."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.tmp = tempfile.mkdtemp(prefix="bench-uds-")
        self.path = os.path.join(self.tmp, "control.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(1)
        self.reader = FrameReader()
        self.conn: socket.socket | None = None

    def accept(self, child: multiprocessing.process.BaseProcess) -> dict[str, Any]:
        """Wait for the child to connect and say READY; returns its info."""
        self.listener.settimeout(0.5)
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while self.conn is None:
            try:
                self.conn, _ = self.listener.accept()
            except TimeoutError:
                if not child.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"{self.label}: child never connected "
                                       f"(exit code {child.exitcode})") from None
        self.conn.settimeout(CONNECT_TIMEOUT_S)
        kind, body = self.receive()
        self.conn.settimeout(None)
        if kind != Msg.READY or body[0] != REPLICA_ID:
            raise RuntimeError(f"{self.label}: expected READY from {REPLICA_ID}, got "
                               f"{kind.name} {body!r}"[:2000])
        return body[1]

    def receive(self) -> tuple[Msg, list[Any]]:
        """Block until one message arrives (the client keeps one request in flight)."""
        while True:
            data = self.conn.recv(RECV_BYTES)
            if not data:
                raise RuntimeError(f"{self.label}: the child hung up")
            messages = self.reader.feed(data)
            if messages:
                if len(messages) > 1:
                    raise RuntimeError(f"{self.label}: {len(messages)} messages for 1 request")
                return decode(messages[0])

    def close(self) -> None:
        for sock in (self.conn, self.listener):
            if sock is not None:
                sock.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def bench_unix(args: argparse.Namespace, *, engine: bool) -> dict[str, Any]:
    """B0 (bare echo child) or B2 (the real engine process), same client, same wire."""
    from omni.engines.proc import EngineSpec, run_engine_process

    label = "B2 engine process" if engine else "B0 unix socket"
    server = UnixServer(label)
    if engine:
        spec = EngineSpec(replica_id=REPLICA_ID, stage="s0", engine="echo",
                          control_path=server.path, log_level=logging.WARNING)
        target, child_args = run_engine_process, (spec,)
    else:
        target, child_args = _bare_echo_child, (server.path,)
    child = multiprocessing.get_context("spawn").Process(target=target, args=child_args,
                                                         daemon=True)
    child.start()
    samples: list[int] = []
    sizes = (0, 0)
    try:
        server.accept(child)
        conn, total, clock = server.conn, args.warmup + args.requests, time.perf_counter_ns
        for i in range(total):
            rid = uuid.uuid4().hex
            t0 = clock()
            message = frame(encode(Msg.ADD, rid, {"prompt": PROMPT}, {}, time.monotonic()))
            conn.sendall(message)
            kind, body = server.receive()
            t1 = clock()
            if kind != Msg.OUTPUTS or body[1][0][0] != rid or not body[1][0][2]:
                raise RuntimeError(f"{label}: unexpected reply {kind.name} {body!r}"[:2000])
            if i >= args.warmup:
                samples.append(t1 - t0)
            sizes = (len(message), len(frame(encode(kind, *body))))
            progress(label, i + 1, total, args.progress_every, samples)
        conn.sendall(frame(encode(Msg.SHUTDOWN)))
        child.join(10)
    finally:
        if child.is_alive():
            child.terminate()
            child.join()
        server.close()
    return _done(label, samples, sizes)


# -- B: raw ZeroMQ round trip between two processes (reference) ------------------------------
def _zmq_echo_child(requests_ep: str, results_ep: str, identity: bytes) -> None:
    """DEALER in, PUSH out; one frame per message, type byte first."""
    ctx = zmq.Context(io_threads=1)
    push = ctx.socket(zmq.PUSH)
    push.connect(results_ep)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, identity)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(requests_ep)
    name = identity.decode()
    dealer.send(b"\x0a" + msgpack.packb([name, {"engine": "raw"}]))
    while True:
        message = dealer.recv()
        if message[:1] == b"\x03":
            break
        rid, inputs, _params = msgpack.unpackb(message[1:])
        row = [rid, {"text": inputs["prompt"], "trace": ["s0"], "index": 0}, True, None]
        push.send(b"\x0b" + msgpack.packb([name, [row], {"running": 0}]))
    push.close(linger=1000)
    dealer.close()
    ctx.term()


def bench_zmq(args: argparse.Namespace) -> dict[str, Any]:
    """Sync ROUTER/PULL here, a bare DEALER/PUSH echo loop in a spawned child."""
    label = "B raw zmq"
    tmp = tempfile.mkdtemp(prefix="bench-zmq-")
    requests_ep, results_ep = f"ipc://{tmp}/requests", f"ipc://{tmp}/results"
    ctx = zmq.Context(io_threads=1)
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.setsockopt(zmq.LINGER, 0)
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    router.bind(requests_ep)
    pull.bind(results_ep)
    identity = REPLICA_ID.encode()
    child = multiprocessing.get_context("spawn").Process(
        target=_zmq_echo_child, args=(requests_ep, results_ep, identity), daemon=True)
    child.start()
    samples: list[int] = []
    sizes = (0, 0)
    try:
        if not router.poll(int(CONNECT_TIMEOUT_S * 1000)):
            raise RuntimeError(f"{label}: child did not say READY within {CONNECT_TIMEOUT_S} s")
        router.recv_multipart()  # READY: the ROUTER now knows the peer
        total, clock = args.warmup + args.requests, time.perf_counter_ns
        for i in range(total):
            rid = uuid.uuid4().hex
            t0 = clock()
            message = b"\x01" + msgpack.packb([rid, {"prompt": PROMPT}, {}])
            router.send_multipart([identity, message])
            reply_frame = pull.recv()
            reply = msgpack.unpackb(reply_frame[1:])
            t1 = clock()
            if reply[1][0][0] != rid:
                raise RuntimeError(f"{label}: reply for the wrong request")
            if i >= args.warmup:
                samples.append(t1 - t0)
            sizes = (len(message), len(reply_frame))
            progress(label, i + 1, total, args.progress_every, samples)
        router.send_multipart([identity, b"\x03" + msgpack.packb([])])
        child.join(10)
    finally:
        if child.is_alive():
            child.terminate()
            child.join()
        router.close()
        pull.close()
        ctx.term()
        shutil.rmtree(tmp, ignore_errors=True)
    return _done(label, samples, sizes)


def _done(label: str, samples: list[int], sizes: tuple[int, int]) -> dict[str, Any]:
    stats = summarize(samples)
    stats["request_bytes"], stats["reply_bytes"] = sizes
    say(f"[{label}] p50 {stats['p50_us']:.1f} us  p99 {stats['p99_us']:.1f} us "
        f"(messages {sizes[0]} B out, {sizes[1]} B back, as sent)")
    return stats
