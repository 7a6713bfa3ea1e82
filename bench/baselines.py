"""The baselines ours is compared with, each one request at a time from a sync client.

  A   in-process: N EchoEngines chained in this process, no sockets -> the engine work.
  B0  raw Unix socket: a listening Unix stream socket here, a spawned child that connects
      and echoes with a bare loop; the same `omni.wire.protocol.encode` messages behind a
      4-byte little-endian length (framing defined here: omni no longer frames streams)
      -> what a plain stream socket costs, the transport omni used before ZeroMQ.
  B   raw ZeroMQ: a ROUTER here, a DEALER in a spawned child with a bare echo loop, ipc,
      one frame per message (the same messages) -> the socket pattern the runtime uses
      (omni/runtime/control.py, omni/engines/proc/channel.py) without the runtime.
  B2  the real engine process: a ROUTER here as omni/runtime/control.py binds it
      (ROUTER_MANDATORY, CONTROL_HWM, ipc in a temp dir) against `run_engine_process`
      with an EchoEngine, driven by identity ``s/0@0`` -> B plus the engine's loop.

Each of B0, B and B2 also runs *idle* (``gap_s``): the client sleeps before every send, so
the child and its threads have gone idle when the message arrives, as each stage of an
N-stage pipeline is while the others run. What waking an idle process costs differs by
transport: a Unix socket wakes one thread, ZeroMQ three (I/O threads on both sides, then
the reader).
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import shutil
import socket
import struct
import tempfile
import time
import uuid
from typing import Any

import zmq

from bench.common import PROMPT, progress, say, summarize
from omni.wire.protocol import (
    CONTROL_HWM,
    Add,
    Message,
    Outputs,
    Ready,
    Row,
    Shutdown,
    decode,
    encode,
    identity,
    ipc_address,
)

REPLICA_ID = "s/0"
STAGE = "s"
RECV_BYTES = 1 << 20
CONNECT_TIMEOUT_S = 60.0
LENGTH = struct.Struct("<I")  # B0's framing: 4-byte little-endian length, then the message


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


def _echo(message: bytes) -> bytes | None:
    """The bare children's answer to one message: Outputs for Add, None for Shutdown."""
    add = decode(message)
    if isinstance(add, Shutdown):
        return None
    row = Row(add.request_id, {"text": add.inputs["prompt"], "trace": [STAGE], "index": 0},
              True)
    return encode(Outputs(REPLICA_ID, [row], time.monotonic(), {"running": 0}))


def _add(rid: str) -> bytes:
    return encode(Add(rid, {"prompt": PROMPT}, {}, time.monotonic()))


def _check(label: str, rid: str, reply: Message) -> None:
    if (not isinstance(reply, Outputs) or reply.rows[0].request_id != rid
            or not reply.rows[0].finished):
        raise RuntimeError(f"{label}: unexpected reply {reply!r}"[:2000])


def _spawn(target: Any, *child_args: Any) -> multiprocessing.process.BaseProcess:
    child = multiprocessing.get_context("spawn").Process(target=target, args=child_args,
                                                         daemon=True)
    child.start()
    return child


def _stop(child: multiprocessing.process.BaseProcess) -> None:
    child.join(10)
    if child.is_alive():
        child.terminate()
        child.join()


def _drive(label: str, args: argparse.Namespace, send: Any, receive: Any,
           gap_s: float = 0.0) -> dict[str, Any]:
    """The measured loop shared by B0, B and B2: one ADD, wait for its OUTPUTS; with
    ``gap_s``, sleep that long before each (the peer goes idle)."""
    samples: list[int] = []
    sizes = (0, 0)
    total, clock = args.warmup + args.requests, time.perf_counter_ns
    for i in range(total):
        rid = uuid.uuid4().hex
        if gap_s:
            time.sleep(gap_s)
        t0 = clock()
        message = _add(rid)
        send(message)
        reply = receive()
        t1 = clock()
        _check(label, rid, decode(reply))
        if i >= args.warmup:
            samples.append(t1 - t0)
        sizes = (len(message), len(reply))
        progress(label, i + 1, total, args.progress_every, samples)
    stats = summarize(samples)
    stats["request_bytes"], stats["reply_bytes"] = sizes
    say(f"[{label}] p50 {stats['p50_us']:.1f} us  p99 {stats['p99_us']:.1f} us "
        f"(messages {sizes[0]} B out, {sizes[1]} B back, framing excluded)")
    return stats


# -- B0: a raw Unix stream socket -------------------------------------------------------------
def _frame(message: bytes) -> bytes:
    return LENGTH.pack(len(message)) + message


class _Reader:
    """Splits a byte stream back into messages; keeps a partial one for later."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buffer = sock, bytearray()

    def messages(self) -> list[bytes]:
        """At least one whole message (blocking); [] when the peer hung up."""
        out: list[bytes] = []
        while not out:
            data = self.sock.recv(RECV_BYTES)
            if not data:
                return []
            self.buffer += data
            pos = 0
            while len(self.buffer) - pos >= LENGTH.size:
                end = pos + LENGTH.size + LENGTH.unpack_from(self.buffer, pos)[0]
                if end > len(self.buffer):
                    break
                out.append(bytes(self.buffer[pos + LENGTH.size:end]))
                pos = end
            del self.buffer[:pos]
        return out


def _unix_echo_child(path: str) -> None:
    """B0's child: connect, READY, then answer each ADD with one OUTPUTS; no engine."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.sendall(_frame(encode(Ready(REPLICA_ID, {"engine": "bare"}))))
    reader = _Reader(sock)
    while messages := reader.messages():
        for message in messages:
            reply = _echo(message)
            if reply is None:
                sock.close()
                return
            sock.sendall(_frame(reply))
    sock.close()


def bench_unix(args: argparse.Namespace, gap_s: float = 0.0) -> dict[str, Any]:
    """B0: a blocking Unix stream socket server here, a bare echo child."""
    label = "B0 raw unix socket" + (" idle" if gap_s else "")
    tmp = tempfile.mkdtemp(prefix="bench-uds-")
    path = f"{tmp}/control.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    listener.settimeout(CONNECT_TIMEOUT_S)
    child = _spawn(_unix_echo_child, path)
    conn = None
    try:
        conn, _ = listener.accept()
        reader = _Reader(conn)

        def receive() -> bytes:
            messages = reader.messages()
            if len(messages) != 1:
                raise RuntimeError(f"{label}: {len(messages)} messages for 1 request")
            return messages[0]

        if not isinstance(decode(receive()), Ready):
            raise RuntimeError(f"{label}: the child's first message is not READY")
        stats = _drive(label, args, lambda m: conn.sendall(_frame(m)), receive, gap_s)
        conn.sendall(_frame(encode(Shutdown())))
        _stop(child)
    finally:
        if child.is_alive():
            child.terminate()
            child.join()
        for sock in (conn, listener):
            if sock is not None:
                sock.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return stats


# -- B and B2: ZeroMQ, ROUTER here, DEALER there -----------------------------------------------
def _zmq_echo_child(address: str, peer: bytes) -> None:
    """B's child: a DEALER named like a replica, READY, then a bare echo loop."""
    ctx = zmq.Context(io_threads=1)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, peer)
    dealer.setsockopt(zmq.LINGER, 1000)
    dealer.connect(address)
    dealer.send(encode(Ready(REPLICA_ID, {"engine": "bare"})))
    while (reply := _echo(dealer.recv())) is not None:
        dealer.send(reply)
    dealer.close()
    ctx.term()


class _Router:
    """The orchestrator's side as plain blocking calls, bound as omni/runtime/control.py
    binds its ROUTER."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.tmp = tempfile.mkdtemp(prefix="bench-zmq-")
        self.address = ipc_address(self.tmp)
        self.ctx = zmq.Context(io_threads=1)
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.SNDHWM, CONTROL_HWM)
        self.sock.setsockopt(zmq.RCVHWM, CONTROL_HWM)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(self.address)
        self.peer = b""

    def wait_ready(self, child: multiprocessing.process.BaseProcess, peer: bytes) -> None:
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while not self.sock.poll(500):
            if not child.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{self.label}: no READY from the child (exit code "
                                   f"{child.exitcode})")
        sender, message = self.sock.recv_multipart()
        ready = decode(message)
        if sender != peer or not isinstance(ready, Ready):
            raise RuntimeError(f"{self.label}: expected Ready from {peer!r}, got {ready!r} "
                               f"from {sender!r}"[:2000])
        self.peer = peer

    def send(self, message: bytes) -> None:
        self.sock.send_multipart((self.peer, message))

    def receive(self) -> bytes:
        sender, message = self.sock.recv_multipart()
        if sender != self.peer:
            raise RuntimeError(f"{self.label}: a message from {sender!r}")
        return message

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()
        shutil.rmtree(self.tmp, ignore_errors=True)


def bench_zmq(args: argparse.Namespace, *, engine: bool, gap_s: float = 0.0) -> dict[str, Any]:
    """B (a bare DEALER echo child) or B2 (the real engine process), same ROUTER client."""
    from omni.engines.proc import EngineSpec, run_engine_process

    label = ("B2 engine process" if engine else "B raw zmq") + (" idle" if gap_s else "")
    router = _Router(label)
    peer = identity(REPLICA_ID, 0)
    if engine:
        spec = EngineSpec(replica_id=REPLICA_ID, stage=STAGE, engine="echo",
                          control_address=router.address, incarnation=0, heartbeat_s=0,
                          log_level=logging.WARNING)
        child = _spawn(run_engine_process, spec)
    else:
        child = _spawn(_zmq_echo_child, router.address, peer)
    try:
        router.wait_ready(child, peer)
        stats = _drive(label, args, router.send, router.receive, gap_s)
        router.send(encode(Shutdown()))  # the engine exits on it, as the bare child does
        _stop(child)
        if child.exitcode != 0:
            raise RuntimeError(f"{label}: the child exited with {child.exitcode}")
    finally:
        if child.is_alive():
            child.terminate()
            child.join()
        router.close()
    return stats
