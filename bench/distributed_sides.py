"""The bench's side of `python -m bench distributed`: peers, and what it times against them.

Every measurement is timed here, on host A (the root namespace); the peers
(bench/distributed_peer.py) only echo or produce. Every wait is bounded by WAIT_S and a
peer that died or went silent raises PeerError with its exit code and the tail of its log.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgpack

from bench.distributed_peer import payload, recv_exact, recv_msg, send_msg
from omni.connector.base import ConnectorError

REPO = Path(__file__).resolve().parent.parent
WAIT_S = 60.0
# a control message of the usual size: a request's few fields and a handful of tokens
MESSAGE = msgpack.packb([3, "chatcmpl-6f1d2c0b9a8e4f7d", "talker/0@0", 17,
                         list(range(1000, 1016)), {"t": 1733412345.123456, "final": False}])


class PeerError(RuntimeError):
    """A peer process died, answered with an error, or did not answer in time."""


class PeerProc:
    """A bench.distributed_peer process on one host, and its side channel."""

    def __init__(self, hosts: Any, host: str, listener: socket.socket, log: Path) -> None:
        self.host, self.log = host, log
        ip, port = listener.getsockname()[:2]
        with open(log, "w") as out:
            self.proc = hosts.exec(host, [sys.executable, "-m", "bench.distributed_peer", ip,
                                          str(port)], cwd=REPO, stdin=subprocess.DEVNULL,
                                   stdout=out, stderr=subprocess.STDOUT)
        try:
            self.side = _nodelay(accept(listener, self))
        except BaseException:
            self.proc.kill()
            self.proc.wait(10)
            raise

    def error(self, what: str) -> PeerError:
        code = self.proc.poll()
        state = "running" if code is None else f"exited with code {code}"
        tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
        return PeerError(f"peer on host {self.host} ({state}): {what}\n--- its log ---\n{tail}")

    def check(self, deadline: float, progress: str) -> None:
        """Raise when the peer died or the deadline (time.monotonic()) passed."""
        if self.proc.poll() is not None:
            raise self.error(f"died ({progress})")
        if time.monotonic() > deadline:
            raise self.error(f"too slow: {progress} in {WAIT_S:g} s")

    def send(self, *msg: Any) -> None:
        send_msg(self.side, list(msg))

    def reply(self, timeout: float = WAIT_S) -> Any:
        self.side.settimeout(timeout)
        try:
            status, value = recv_msg(self.side)
        except (TimeoutError, ConnectionError, OSError) as exc:
            raise self.error(f"no answer within {timeout:g} s ({exc})") from None
        if status != "ok":
            raise self.error(f"answered {value}")
        return value

    def call(self, *msg: Any, timeout: float = WAIT_S) -> Any:
        self.send(*msg)
        return self.reply(timeout)

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.call("exit", timeout=10)
        except (PeerError, OSError):
            pass
        finally:
            self.side.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def accept(listener: socket.socket, peer: PeerProc) -> socket.socket:
    """The peer's connection to `listener`, waiting at most WAIT_S and not past its death."""
    listener.settimeout(0.5)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            if peer.proc.poll() is not None:
                raise peer.error("exited before connecting") from None
            continue
        conn.settimeout(WAIT_S)
        return conn
    raise peer.error(f"did not connect within {WAIT_S:g} s")


def _nodelay(conn: socket.socket) -> socket.socket:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


# -- 1. the link ----------------------------------------------------------------------------

def link_rtt(peer: PeerProc, ip: str, total: int) -> list[int]:
    """1-byte TCP ping-pong with the peer; ns per round trip."""
    with socket.create_server((ip, 0)) as server:
        peer.send("tcp_echo", server.getsockname()[1], total)
        with _nodelay(accept(server, peer)) as conn:
            samples = []
            try:
                for _ in range(total):
                    t0 = time.perf_counter_ns()
                    conn.sendall(b"x")
                    recv_exact(conn, 1)
                    samples.append(time.perf_counter_ns() - t0)
            except OSError as exc:  # ConnectionError, TimeoutError: the peer died or hung
                raise peer.error(f"link ping-pong: {exc}") from None
        peer.reply()
    return samples


# -- 2. the control hop ---------------------------------------------------------------------

def router_hop(peer: PeerProc, address: str, keys: Any, total: int) -> list[int]:
    """omni's ControlRouter (on uvloop, as the orchestrator runs it) <-> the peer's engine
    Channel: ns per round trip of MESSAGE."""
    import uvloop

    loop = uvloop.new_event_loop()
    try:
        return loop.run_until_complete(_router_pingpong(peer, address, keys, total))
    finally:
        loop.close()


async def _router_pingpong(peer: PeerProc, address: str, keys: Any, total: int) -> list[int]:
    from omni.runtime.control import ControlRouter

    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()
    samples: list[int] = []
    sent = [0]

    def on_message(identity: bytes, message: bytes) -> None:
        now = time.perf_counter_ns()
        if sent[0]:  # not the hello
            samples.append(now - sent[0])
            if message != MESSAGE:
                done.set_exception(PeerError(f"echo differs: {message[:40]!r}"))
                return
        if len(samples) == total:
            done.set_result(None)
            return
        sent[0] = time.perf_counter_ns()
        router.send(identity, MESSAGE)

    router = ControlRouter(address, on_message, curve=keys)
    try:
        router.attach(loop)
        peer.send("zmq_echo", "channel", router.address, keys and keys.to_dict(), total)
        deadline = time.monotonic() + WAIT_S
        while not done.done():  # bounded, and not a moment past the peer's death
            await asyncio.wait([done], timeout=0.5)
            peer.check(deadline, f"{len(samples)} of {total} echoes")
        done.result()
    finally:
        router.close()
    peer.reply()
    return samples


def raw_hop(peer: PeerProc, address: str, keys: Any, total: int) -> list[int]:
    """A bare pyzmq ROUTER (blocking, CURVE + the Gatekeeper when `keys`) <-> a bare DEALER."""
    import zmq

    from omni.wire.curve import Gatekeeper, serve_curve

    ctx = zmq.Context(io_threads=1)
    gate = Gatekeeper(ctx, keys) if keys is not None else None
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 500)  # then look at the peer and the deadline
    if keys is not None:
        serve_curve(sock, keys)
    try:
        sock.bind(address)
        peer.send("zmq_echo", "raw", sock.getsockopt_string(zmq.LAST_ENDPOINT),
                  keys and keys.to_dict(), total)
        samples: list[int] = []
        deadline = time.monotonic() + WAIT_S

        def recv() -> list[bytes]:
            while True:
                try:
                    return sock.recv_multipart()
                except zmq.Again:
                    peer.check(deadline, f"{len(samples)} of {total} echoes")

        identity, _ = recv()
        for _ in range(total):
            t0 = time.perf_counter_ns()
            sock.send(identity, zmq.SNDMORE)
            sock.send(MESSAGE)
            _, message = recv()
            samples.append(time.perf_counter_ns() - t0)
            if message != MESSAGE:
                raise PeerError(f"echo differs: {message[:40]!r}")
        peer.reply()
        return samples
    finally:
        sock.close()
        if gate is not None:
            gate.stop()
        ctx.term()


# -- 3. payloads ----------------------------------------------------------------------------

class PayloadSides:
    """Consumers here for each backend the peer produces with, and the raw TCP receiver."""

    def __init__(self, peer: PeerProc, ip: str, peer_ip: str, keys: Any, capacity: int) -> None:
        from omni.connector import make_connector

        self.peer = peer
        made, self.errors = peer.call("producers", peer_ip, keys.to_dict(), capacity)
        self.consumers: dict[str, Any] = {}
        for backend in made:
            kind, curve = ("zmq", keys.to_dict()) if backend == "zmq" else (
                ("zmq", None) if backend == "zmq-plain" else (backend, None))
            try:
                self.consumers[backend] = make_connector(
                    kind, name=f"bench-consumer-{backend}", capacity_bytes=capacity, host=ip,
                    curve=curve)
            except Exception as exc:  # noqa: BLE001 - reported as "not measured, why"
                self.errors[backend] = f"consumer: {type(exc).__name__}: {exc}"
        self.server = socket.create_server((ip, 0))
        peer.send("raw_open", self.server.getsockname()[1])
        self.raw = _nodelay(accept(self.server, peer))
        peer.reply()
        self.backends = ["raw-tcp", *self.consumers]
        self.buf: Any = None

    def one(self, backend: str, size: int, i: int, expected: Any) -> tuple[int, int, bool]:
        """(ns of get + release, ns of the release, bytes equal) for payload i of `size`
        through `backend`."""
        if backend == "raw-tcp":
            return self._raw(size, i, expected)
        import torch

        from omni.connector import PayloadRef
        ref = PayloadRef.from_wire(self.peer.call("put", backend, size, i))
        consumer = self.consumers[backend]
        t0 = time.perf_counter_ns()
        got = consumer.get(ref)
        t1 = time.perf_counter_ns()
        consumer.release(ref)
        t2 = time.perf_counter_ns()
        return t2 - t0, t2 - t1, got.dtype == torch.float32 and torch.equal(
            got.view(torch.uint8), expected)

    def _raw(self, size: int, i: int, expected: Any) -> tuple[int, int, bool]:
        import torch

        if self.buf is None or self.buf.numel() != size:
            self.buf = torch.zeros(size, dtype=torch.uint8)
        view = memoryview(self.buf.numpy())
        self.buf[:1] = ~expected[:1]  # a stale buffer must fail the check
        self.peer.call("raw", size, i)  # the peer has the payload ready
        t0 = time.perf_counter_ns()
        self.raw.sendall(b"g")
        got = 0
        while got < size:
            n = self.raw.recv_into(view[got:])
            if not n:
                raise self.peer.error("raw copy connection closed")
            got += n
        elapsed = time.perf_counter_ns() - t0
        return elapsed, 0, torch.equal(self.buf, expected)

    def measure(self, size: int, warmup: int, iters: int) -> dict[str, dict[str, Any]]:
        """ns samples and failed checks per backend; the backends take turns per payload,
        in a rotating order, so drift on a shared machine hits all of them alike."""
        out = {b: {"ns": [], "release_ns": [], "bad": 0} for b in self.backends}
        k = len(self.backends)
        for i in range(warmup + iters):
            expected = payload(size, i)
            for backend in self.backends[i % k:] + self.backends[:i % k]:
                try:
                    ns, release_ns, ok = self.one(backend, size, i, expected)
                except (ConnectorError, OSError) as exc:  # OSError: timeouts, resets
                    raise self.peer.error(f"{backend}, payload {i} of {size} bytes: "
                                          f"{type(exc).__name__}: {exc}") from None
                out[backend]["bad"] += not ok  # warm-up payloads are checked too
                if i >= warmup:
                    out[backend]["ns"].append(ns)
                    out[backend]["release_ns"].append(release_ns)
        return out

    def close(self) -> None:
        for consumer in self.consumers.values():
            consumer.close()
        self.raw.close()
        self.server.close()
