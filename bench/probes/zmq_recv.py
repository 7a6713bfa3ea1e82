"""zmq payload get + release across the netns link, by reply shape, with page faults.

``python -m bench.probes.zmq_recv [SIZES] [ROUNDS] [PARTS] [lo]`` (root, iproute2; SIZES
like ``64K,1M,8M,64M``, PARTS like ``whole,256K,1M``; ``lo``: the peer on this host, over
127.0.0.1, no namespaces): the payload part of `python -m bench distributed` (its peer and
sides) for raw-tcp, zmq (CURVE) and zmq-plain, each zmq row once per reply shape: ``whole``
(every payload one frame: the code before 2026-12-04) or a part size (zmq_server.PART_BYTES;
sent in parts: plain payloads over zmq_server.WHOLE_UP_TO, CURVE ones over the part size).
The rows take turns payload by payload, as in the bench. Printed per size and row: p50
time, MB/s, its ratio to the raw copy, and the consumer process's minor page faults per
payload (``ru_minflt``, every thread: libzmq's I/O thread receives).
"""

from __future__ import annotations

import resource
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import distributed_peer as peer_mod
from bench import netns
from bench.distributed_sides import REPO, PayloadSides, PeerProc, _nodelay, accept
from bench.shm_throughput import _label, _size, _sizes


def shape(name: str) -> tuple[str, int]:
    """``"zmq-plain@1M"`` -> ``("zmq-plain", 1 MiB)``; 0 = whole."""
    backend, _, part = name.partition("@")
    return backend, 0 if part in ("", "whole") else _size(part)


class PartPeer(peer_mod.Peer):
    """The bench's peer, setting the producer's reply shape per put (the next fetch)."""

    defaults: tuple[int, int] | None = None

    def put(self, backend: str, size: int, i: int) -> list:
        from omni.connector import zmq_server as server

        self.defaults = self.defaults or (server.PART_BYTES, server.WHOLE_UP_TO)
        backend, part = shape(backend)
        server.PART_BYTES = part or 1 << 62
        server.WHOLE_UP_TO = self.defaults[1] if part else 1 << 62
        return super().put(backend, size, i)


class ProbePeer(PeerProc):
    """PeerProc running PartPeer (same side channel, same commands)."""

    def __init__(self, hosts: Any, host: str, listener: socket.socket, log: Path) -> None:
        self.host, self.log = host, log
        ip, port = listener.getsockname()[:2]
        code = ("import sys; from bench import distributed_peer as p; "
                "from bench.probes.zmq_recv import PartPeer; p.Peer = PartPeer; "
                "sys.exit(p.main(sys.argv[1:]))")
        with open(log, "w") as out:
            self.proc = hosts.exec(host, [sys.executable, "-c", code, ip, str(port)],
                                   cwd=REPO, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT)
        try:
            self.side = _nodelay(accept(listener, self))
        except BaseException:
            self.proc.kill()
            self.proc.wait(10)
            raise


class FaultSides(PayloadSides):
    """PayloadSides over zmq rows per reply shape, counting the consumer's minor faults."""

    def __init__(self, peer: PeerProc, ip: str, peer_ip: str, keys: Any, capacity: int,
                 parts: list[str]) -> None:
        super().__init__(peer, ip, peer_ip, keys, capacity)
        for name in [b for b in self.consumers if not b.startswith("zmq")]:
            self.consumers.pop(name).close()
        base = dict(self.consumers)
        self.consumers = {f"{b}@{p}": c for b, c in base.items() for p in parts}
        self.backends = ["raw-tcp", *self.consumers]
        self.faults: dict[str, list[int]] = {b: [] for b in self.backends}

    def one(self, backend: str, size: int, i: int, expected: Any) -> tuple[int, int, bool]:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        out = super().one(backend, size, i, expected)
        self.faults[backend].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                                    - before)
        return out

    def close(self) -> None:
        for consumer in set(self.consumers.values()):
            consumer.close()
        self.consumers.clear()
        super().close()


def iterations(size: int, rounds: int) -> tuple[int, int]:
    per = max(10, min(200, (256 << 20) // size))
    return max(2, per // 10), per * rounds


def report(sides: FaultSides, size: int, measured: dict[str, dict[str, Any]],
           iters: int) -> None:
    raw = statistics.median(measured["raw-tcp"]["ns"])
    print(f"{_label(size):>6}:", flush=True)
    for backend, m in measured.items():
        p50 = statistics.median(m["ns"])
        faults = statistics.median(sides.faults[backend][-iters:])
        print(f"   {backend:<16} p50 {p50 / 1e3:9.1f} us  {size / p50 * 1e3:7.0f} MB/s  "
              f"{raw / p50:5.0%} of raw  faults/payload {faults:6.0f}  wrong {m['bad']}",
              flush=True)
        sides.faults[backend].clear()


class Loopback:
    """Stands in for netns.Hosts when the peer runs on this host, over 127.0.0.1."""

    root_ip = "127.0.0.1"

    def ip(self, host: str) -> str:
        return self.root_ip

    def exec(self, host: str, argv: list[str], **popen_kwargs: Any) -> subprocess.Popen:
        return subprocess.Popen(argv, **popen_kwargs)


def run(hosts: Any, host: str, sizes: list[int], rounds: int, parts: list[str]) -> None:
    from omni.wire.curve import CurveKeys

    with tempfile.TemporaryDirectory() as tmp, \
            socket.create_server((hosts.root_ip, 0)) as listener:
        peer = ProbePeer(hosts, host, listener, Path(tmp) / "peer.log")
        try:
            sides = FaultSides(peer, hosts.root_ip, hosts.ip(host), CurveKeys.generate(),
                               2 * max(sizes), parts)
            try:
                for size in sizes:
                    warmup, iters = iterations(size, rounds)
                    peer_mod.payload(size, 0)  # the pattern, made before timing
                    report(sides, size, sides.measure(size, warmup, iters), iters)
            finally:
                sides.close()
        finally:
            peer.close()


def main(argv: list[str]) -> int:
    sizes = _sizes(argv[0] if argv else "64K,1M,8M,64M")
    rounds = int(argv[1]) if len(argv) > 1 else 1
    parts = (argv[2] if len(argv) > 2 else "whole,256K").split(",")
    if len(argv) > 3 and argv[3] == "lo":
        run(Loopback(), netns.ROOT, sizes, rounds, parts)
        return 0
    ok, why = netns.available()
    if not ok:
        print(f"no network namespaces here: {why} (add 'lo' to run over 127.0.0.1)")
        return 2
    with netns.Hosts(1) as hosts:
        run(hosts, "b", sizes, rounds, parts)
    return 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
