"""mooncake get + release against a raw TCP pull, the producer in another process.

``python bench/probes/mooncake_get.py [loopback|netns] [SIZES]``: the peer of ``python -m
bench distributed`` (bench/distributed_peer.py) produces float32 payloads; this process
times ``get(ref)`` + ``release(ref)`` of the ``mooncake`` connector and the raw pull,
taking turns payload by payload, every payload checked byte for byte (as bench
distributed's section 3, without zmq). ``loopback``: the peer in the root namespace,
everything over 127.0.0.1; ``netns`` (root): the peer on host B of ``bench.netns.Hosts``.
Prints per size p50 / mean / p99 of get + release, the release alone, and how many
fetches took longer than 4x the p50 (bench/probes/README.md).
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import netns  # noqa: E402
from bench.distributed_sides import PayloadSides, PeerProc  # noqa: E402
from omni.wire.curve import CurveKeys  # noqa: E402

KiB, MiB = 1024, 1024 * 1024
ITERS = {64 * KiB: (40, 400), 1 * MiB: (10, 100), 8 * MiB: (4, 40), 64 * MiB: (2, 20)}


class Loopback:
    """bench.netns.Hosts' exec, for a peer in this namespace."""

    def exec(self, host: str, argv: list[str], **kw: object) -> subprocess.Popen:
        return subprocess.Popen(argv, **kw)


def row(size: int, backend: str, data: dict) -> str:
    ns = sorted(data["ns"])
    p50 = ns[len(ns) // 2] / 1e3
    p99 = ns[min(len(ns) - 1, round(0.99 * len(ns)))] / 1e3
    mean = statistics.fmean(ns) / 1e3
    rel = sorted(data["release_ns"])[len(ns) // 2] / 1e3
    slow = sum(n > 4 * ns[len(ns) // 2] for n in ns)
    return (f"{size // KiB:>6} KiB {backend:9} p50 {p50:9.1f} us  mean {mean:9.1f} us  "
            f"p99 {p99:9.1f} us  release p50 {rel:6.1f} us  MB/s(p50) {size / p50:7.0f}  "
            f">4x p50: {slow}/{len(ns)}  wrong {data['bad']}")


def main(mode: str, sizes: list[int]) -> None:
    with tempfile.TemporaryDirectory(prefix="mc-probe-") as tmp:
        if mode == "netns":
            with netns.Hosts(1) as hosts:
                run(hosts, "b", hosts.root_ip, hosts.ip("b"), Path(tmp), sizes)
        else:
            run(Loopback(), netns.ROOT, "127.0.0.1", "127.0.0.1", Path(tmp), sizes)


def run(hosts: object, host: str, ip: str, peer_ip: str, tmp: Path, sizes: list[int]) -> None:
    with socket.create_server((ip, 0)) as listener:
        peer = PeerProc(hosts, host, listener, tmp / "peer.log")
        try:
            sides = PayloadSides(peer, ip, peer_ip, CurveKeys.generate(), 2 * max(sizes))
            sides.backends = ["raw-tcp", "mooncake"]
            try:
                for size in sizes:
                    warmup, iters = ITERS[size]
                    for backend, data in sides.measure(size, warmup, iters).items():
                        print(row(size, backend, data), flush=True)
                health = sides.consumers["mooncake"].health()
                print({k: v for k, v in health.items() if "pool" in k or "release" in k})
            finally:
                sides.close()
        finally:
            peer.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "loopback",
         [int(s) * KiB for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else list(ITERS))
