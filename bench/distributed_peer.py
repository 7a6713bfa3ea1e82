"""The other end of `python -m bench distributed`: a process on "host B" (a namespace).

``python -m bench.distributed_peer HOST PORT`` connects to the bench's side channel (a
plain TCP socket, length-prefixed msgpack) and runs its commands one at a time, each
answered on the side channel:

  ["tcp_echo", port, count]            connect to HOST:port, echo `count` 1-byte messages
  ["zmq_echo", kind, address, curve, count]
                                       a DEALER ("channel": omni's engine Channel; "raw":
                                       a bare pyzmq socket) sends a hello, then echoes
                                       `count` messages
  ["producers", host, curve, capacity] one producer per backend (zmq, zmq-plain,
                                       mooncake where it builds), serving on `host`
  ["put", backend, size, i]            publish payload i of `size` bytes; answers its wire ref
  ["raw_open", port]                   connect the raw-copy socket to HOST:port
  ["raw", size, i]                     fill the raw buffer with payload i, answer, then wait
                                       for the 1-byte request and sendall the buffer
  ["pin", cpus]                        run this thread, and the threads it starts from now
                                       on, on `cpus` (None: every CPU)
  ["exit"]

Payload i of a size is ``pattern(size) + i`` (uint8, wrapping): every byte differs from the
previous payload's, so the consumer can check each one against its own copy. Every wait
is bounded (socket timeouts, zmq RCVTIMEO), and the process dies with its parent
(PR_SET_PDEATHSIG), so a dead bench leaves no peer behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import struct
import sys
from typing import Any

import msgpack

WAIT_S = 60.0  # any single wait of the peer: a command, a message, a request
_LEN = struct.Struct("<I")
_patterns: dict[int, Any] = {}


# -- the side channel (also used by the bench) --------------------------------------------

def send_msg(sock: socket.socket, obj: Any) -> None:
    body = msgpack.packb(obj, use_bin_type=True)
    sock.sendall(_LEN.pack(len(body)) + body)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("side channel closed by the other end")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv_msg(sock: socket.socket) -> Any:
    (n,) = _LEN.unpack(recv_exact(sock, _LEN.size))
    return msgpack.unpackb(recv_exact(sock, n), raw=False)


def pattern(size: int) -> Any:
    """The same random bytes in every process (a fixed seed per size)."""
    import torch

    if size not in _patterns:
        gen = torch.Generator().manual_seed(size)
        _patterns[size] = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=gen)
    return _patterns[size]


def payload(size: int, i: int, out: Any = None) -> Any:
    """Payload i as uint8 (into `out` when given)."""
    import torch

    return torch.add(pattern(size), i % 256, out=out)


# -- commands -----------------------------------------------------------------------------

class Peer:
    def __init__(self, side: socket.socket, host: str) -> None:
        self.side, self.host = side, host
        self.producers: dict[str, Any] = {}
        self.raw: socket.socket | None = None
        self.raw_bufs: dict[int, Any] = {}

    def _connect(self, port: int) -> socket.socket:
        sock = socket.create_connection((self.host, port), timeout=WAIT_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def tcp_echo(self, port: int, count: int) -> int:
        with self._connect(port) as sock:
            for _ in range(count):
                sock.sendall(recv_exact(sock, 1))
        return count

    def zmq_echo(self, kind: str, address: str, curve: dict | None, count: int) -> int:
        import zmq

        from omni.wire.curve import CurveKeys
        keys = CurveKeys.from_dict(curve) if curve else None
        if kind == "channel":
            from omni.engines.proc.channel import Channel
            end = Channel(address, b"bench/0@0", "bench/0", curve=keys)
            sock, close = end.sock, end.close
        else:
            ctx = zmq.Context(io_threads=1)
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 1000)
            if keys is not None:
                from omni.wire.curve import connect_curve
                connect_curve(sock, keys)
            sock.connect(address)

            def close() -> None:
                sock.close()
                ctx.term()
        sock.setsockopt(zmq.RCVTIMEO, int(WAIT_S * 1000))  # zmq.Again, never a hang
        try:
            sock.send(b"hello")
            for _ in range(count):
                sock.send(sock.recv())
        finally:
            close()
        return count

    def producers_(self, host: str, curve: dict | None, capacity: int) -> list[str]:
        from omni.connector import make_connector
        from omni.connector.base import ConnectorError

        made, errors = [], {}
        for backend, kind, keys in (("zmq", "zmq", curve), ("zmq-plain", "zmq", None),
                                    ("mooncake", "mooncake", None)):
            try:
                self.producers[backend] = make_connector(
                    kind, name=f"bench-peer-{backend}", capacity_bytes=capacity, host=host,
                    curve=keys)
                made.append(backend)
            except (ConnectorError, ImportError, RuntimeError, OSError) as exc:
                errors[backend] = f"{type(exc).__name__}: {exc}"
        return [made, errors]

    def put(self, backend: str, size: int, i: int) -> list:
        import torch

        value = payload(size, i).view(torch.float32)  # hidden-state-like: float32
        return self.producers[backend].put(value, owner=f"p{i}").to_wire()

    def pin(self, cpus: list[int] | None) -> list[int]:
        os.sched_setaffinity(0, cpus or range(os.cpu_count() or 1))
        return sorted(os.sched_getaffinity(0))

    def raw_open(self, port: int) -> int:
        self.raw = self._connect(port)
        return port

    def raw_send(self, size: int, i: int) -> int:
        import torch

        buf = self.raw_bufs.get(size)
        if buf is None:
            self.raw_bufs.clear()
            buf = self.raw_bufs[size] = torch.empty(size, dtype=torch.uint8)
        payload(size, i, out=buf)
        send_msg(self.side, ["ok", i])  # ready: the bench now times request -> last byte
        recv_exact(self.raw, 1)
        self.raw.sendall(memoryview(buf.numpy()))
        return -1  # already answered

    def close(self) -> None:
        for producer in self.producers.values():
            producer.close()
        if self.raw is not None:
            self.raw.close()


def serve(peer: Peer) -> None:
    handlers = {"tcp_echo": peer.tcp_echo, "zmq_echo": peer.zmq_echo, "pin": peer.pin,
                "producers": peer.producers_, "put": peer.put, "raw_open": peer.raw_open,
                "raw": peer.raw_send}
    while True:
        op, *args = recv_msg(peer.side)
        if op == "exit":
            send_msg(peer.side, ["ok", None])
            return
        try:
            result = handlers[op](*args)
        except Exception as exc:  # noqa: BLE001 - reported to the bench, which raises
            send_msg(peer.side, ["error", f"{op}: {type(exc).__name__}: {exc}"])
            continue
        if result != -1:
            send_msg(peer.side, ["ok", result])


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def main(argv: list[str]) -> int:
    _die_with_parent()
    host, port = argv[0], int(argv[1])
    side = socket.create_connection((host, port), timeout=WAIT_S)
    side.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    side.settimeout(None)  # idle between commands for as long as the bench likes; a dead
    # bench closes the socket (EOF) or kills us (PR_SET_PDEATHSIG)
    peer = Peer(side, host)
    try:
        serve(peer)
    finally:
        peer.close()
        side.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
