"""Two hosts on one machine: the link, the control hop and payload transfer across them.

``python -m bench distributed`` makes host B as a network namespace joined to the root
namespace (host A, this process) by a veth pair on a Linux bridge (bench/netns/), starts
peer processes (bench/distributed_peer.py) and measures, timing everything on host A:

  1. link      1-byte TCP ping-pong between a process on B and this one: the floor of any
               round trip across the "network".
  2. control   a ~100-byte msgpack message ROUTER -> DEALER -> ROUTER (one hop = one round
               trip): omni's ControlRouter (uvloop reader, as the orchestrator runs it) and
               the engine's Channel, (i) local: the DEALER on host A over ipc:// (what local
               replicas use), (ii) cross-host: the DEALER on B over tcp:// with CURVE (what
               remote replicas use); bare pyzmq sockets over ipc://, plain tcp:// (which the
               ControlRouter refuses off loopback) and tcp:// + CURVE for reference.
               Sections 1 and 2 run twice: threads on any CPU, and every thread of both
               ends on CPU 0 (no cross-vCPU wake-ups, which a VM makes slow and erratic).
               The rows take turns (--rounds). Target: cross-host p50 <= 2 x local p50 +
               link p50.
  3. payloads  a producer on B publishes float32 tensors, the ref goes to this process over
               a side channel (not timed), which times get(ref) + release(ref): `zmq` with
               the launch's CURVE keys (as the system runs it), `zmq-plain` (no CURVE) and
               `mooncake`; against `raw-tcp`: a 1-byte request, then the peer's sendall of a
               preallocated buffer into recv_into of another, one connection for the run.
               Every payload's bytes are checked against a copy made here; the release is
               also timed alone. The backends take turns payload by payload. Target: 64 MiB
               at >= 70% of raw-tcp's throughput.
  4. from 3, the size from which mooncake beats zmq without CURVE (`auto` sends only
               unencrypted payloads through mooncake) on both p50 and mean time: the
               recommended MOONCAKE_FROM_BYTES.

Needs root (namespaces, veths). Writes distributed.md and distributed.json under --out.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import mmap
import os
import platform
import shlex
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import distributed_report, netns
from bench.common import code_commit, cpu_times, say, steal_share, summarize
from bench.distributed_sides import (
    PayloadSides,
    PeerProc,
    link_rtt,
    raw_hop,
    router_hop,
)
from bench.shm_throughput import _label, _sizes

DESCRIPTION = __doc__
DEFAULT_SIZES = "64K,1M,8M,64M"
# what this benchmark runs: a change here makes the report's commit "working tree on ..."
CODE = ("bench/distributed.py", "bench/distributed_peer.py", "bench/distributed_sides.py",
        "bench/distributed_report.py", "bench/netns", "bench/common.py", "omni/connector",
        "omni/wire/curve.py", "omni/wire/protocol.py", "omni/runtime/control.py",
        "omni/engines/proc/channel.py")
PINNED = "@cpu0"  # the rows again with both ends on one CPU: no cross-CPU wake-ups


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--round-trips", type=int, default=2000,
                        help="timed round trips per link and control row (default 2000)")
    parser.add_argument("--rounds", type=int, default=10,
                        help="the link and control rows take turns this many times, each "
                             "time with round-trips / rounds (default 10)")
    parser.add_argument("--warmup", type=int, default=50,
                        help="round trips dropped at the start of each row's turn (default 50)")
    parser.add_argument("--sizes", default=DEFAULT_SIZES, type=_sizes, metavar="S,S,...",
                        help=f"payload sizes, K/M/G suffixes (default {DEFAULT_SIZES})")
    parser.add_argument("--iters-scale", type=float, default=1.0,
                        help="scales the payloads per size: round(50 x sqrt(1 MiB / size)) "
                             "within 10..200, i.e. 200 at 64 KiB, 50 at 1 MiB, 10 at 64 MiB "
                             "(warm-up: a tenth, at least 2)")
    parser.add_argument("--out", default="bench/results", type=Path)
    parser.add_argument("--tag", default="", help="report name distributed-TAG.md")


def iterations(size: int, scale: float) -> tuple[int, int]:
    """(warm-up, timed) payloads for a size."""
    n = min(200, max(10, round(50 * math.sqrt((1 << 20) / size))))
    n = max(2, round(n * scale))
    return max(2, n // 10), n


def run(args: argparse.Namespace, argv: list[str]) -> int:
    ok, why = netns.available()
    if not ok:
        say(f"bench distributed: cannot make hosts as network namespaces here: {why}. "
            "Run it as root on Linux with iproute2.")
        return 2
    from omni.wire.curve import CurveKeys

    name = f"distributed-{args.tag}" if args.tag else "distributed"
    result: dict[str, Any] = {
        "command": "python -m bench " + shlex.join(argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": code_commit(paths=CODE), "hardware": machine()}
    started, cpu0 = time.monotonic(), cpu_times()
    with netns.Hosts(1) as hosts, tempfile.TemporaryDirectory(prefix="omni-bench-") as tmp:
        result.update(measure(args, hosts, Path(tmp), CurveKeys.generate()))
    result["wall_s"] = round(time.monotonic() - started, 1)
    result["hardware"]["steal_share"] = steal_share(cpu0, cpu_times())
    result["hardware"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result["derived"] = distributed_report.derive(result)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / f"{name}.md").write_text(distributed_report.render(result))
    say(distributed_report.summary_line(result))
    say(f"wrote {args.out / name}.md and .json")
    return 0


def measure(args: argparse.Namespace, hosts: netns.Hosts, tmp: Path, keys: Any) -> dict:
    a_ip, b_ip = hosts.root_ip, hosts.ip("b")
    out: dict[str, Any] = {"hosts": {"a": a_ip, "b": b_ip}, "rounds": args.rounds}
    peers: list[PeerProc] = []
    with socket.create_server((a_ip, 0)) as listener:
        try:
            say(f"host A {a_ip} (root namespace), host B {b_ip} ({hosts.ns('b')}): starting "
                "peers")
            peer_b = PeerProc(hosts, "b", listener, tmp / "peer-b.log")
            peers.append(peer_b)
            peer_a = PeerProc(hosts, netns.ROOT, listener, tmp / "peer-a.log")
            peers.append(peer_a)
            rows = {}
            for suffix, cpus in (("", None), (PINNED, [0])):
                rows.update({name + suffix: pinned(fn, cpus, peer_a, peer_b)
                             for name, fn in control_rows(peer_a, peer_b, a_ip, tmp,
                                                          keys).items()})
            stats = round_trips(args, rows)
            out["link"] = {k: stats.pop(k) for k in ("link", "link" + PINNED)}
            out["control"] = stats
            out["payloads"] = payloads(args, peer_b, a_ip, b_ip, keys)
        finally:
            for peer in reversed(peers):
                peer.close()
    return out


def control_rows(peer_a: PeerProc, peer_b: PeerProc, a_ip: str, tmp: Path,
                 keys: Any) -> dict[str, Any]:
    """name -> fn(round trips, turn) -> ns samples, for sections 1 and 2."""
    cross, seq = f"tcp://{a_ip}:*", itertools.count()

    def ipc() -> str:  # a new path every time: nothing depends on a stale socket file
        return f"ipc://{tmp}/{next(seq)}.sock"

    return {
        "link": lambda n, r: link_rtt(peer_b, a_ip, n),
        "omni-local-ipc": lambda n, r: router_hop(peer_a, ipc(), None, n),
        "omni-cross-curve": lambda n, r: router_hop(peer_b, cross, keys, n),
        "raw-local-ipc": lambda n, r: raw_hop(peer_a, ipc(), None, n),
        "raw-cross-tcp": lambda n, r: raw_hop(peer_b, cross, None, n),
        "raw-cross-curve": lambda n, r: raw_hop(peer_b, cross, keys, n),
    }


def pinned(fn: Any, cpus: list[int] | None, *peers: PeerProc) -> Any:
    """fn, run with this thread and the peers' main threads (and every thread they start
    meanwhile: zmq's I/O threads) on `cpus`; None: as the scheduler likes."""
    if cpus is None:
        return fn

    def run(n: int, r: int) -> list[int]:
        every = os.sched_getaffinity(0)
        for peer in peers:
            peer.call("pin", cpus)
        os.sched_setaffinity(0, cpus)
        try:
            return fn(n, r)
        finally:
            os.sched_setaffinity(0, every)
            for peer in peers:
                peer.call("pin", None)
    return run


def round_trips(args: argparse.Namespace, rows: dict[str, Any]) -> dict[str, dict]:
    """Every row in --rounds rounds, in a rotating order, so that a change of the shared
    machine's load during the run (it moves these latencies by 3x) hits every row alike."""
    per = math.ceil(args.round_trips / args.rounds)
    samples: dict[str, list[int]] = {k: [] for k in rows}
    medians: dict[str, list[float]] = {k: [] for k in rows}
    names = list(rows)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            got = rows[name](args.warmup + per, r)[args.warmup:]
            samples[name] += got
            medians[name].append(round(statistics.median(got) / 1e3, 2))
    out = {}
    for name in names:
        out[name] = {**summarize(samples[name]), "rounds_p50_us": medians[name]}
        say(f"  {name}: p50 {out[name]['p50_us']} us, p99 {out[name]['p99_us']} us, "
            f"p50 per round {medians[name]}")
    return out


def payloads(args: argparse.Namespace, peer: PeerProc, a_ip: str, b_ip: str,
             keys: Any) -> dict[str, Any]:
    sides = PayloadSides(peer, a_ip, b_ip, keys, capacity=2 * max(args.sizes))
    try:
        out: dict[str, Any] = {"backends": sides.backends, "not_measured": sides.errors,
                               "sizes": []}
        for backend, why in sides.errors.items():
            say(f"  payloads: {backend} not measured: {why}")
        for size in args.sizes:
            warmup, iters = iterations(size, args.iters_scale)
            measured = sides.measure(size, warmup, iters)
            rows = {b: {**throughput(size, m["ns"]), "bad": m["bad"],
                        "release_p50_us": round(statistics.median(m["release_ns"]) / 1e3, 2),
                        "release_max_us": round(max(m["release_ns"]) / 1e3, 2)}
                    for b, m in measured.items()}
            out["sizes"].append({"size": size, "warmup": warmup, "iters": iters, "rows": rows,
                                 "fresh_buffer_us": fresh_buffer_us(size)})
            say(f"  {_label(size):>8}: " + "  ".join(
                f"{b} {r['p50_us']:.0f} us {r['mbps_p50']:.0f} MB/s"
                + (f" ({r['bad']} WRONG)" if r["bad"] else "") for b, r in rows.items()))
        return out
    finally:
        sides.close()


def fresh_buffer_us(size: int, repeats: int = 5) -> float:
    """Median time to map `size` fresh bytes and touch every page: what a receiver pays when
    each payload lands in new memory (glibc serves allocations over 32 MiB by mmap)."""
    import numpy as np

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        with mmap.mmap(-1, size) as mapped:
            view = np.frombuffer(mapped, dtype=np.uint8)
            view[::mmap.PAGESIZE] = 1
            del view
        times.append(time.perf_counter_ns() - t0)
    return round(statistics.median(times) / 1e3, 1)


def throughput(size: int, ns: list[int]) -> dict[str, Any]:
    stats = summarize(ns)
    stats["mbps_p50"] = round(size / stats["p50_us"], 1)  # bytes/us = MB/s
    stats["mbps_mean"] = round(size * len(ns) / (sum(ns) / 1e3), 1)
    return stats


def machine() -> dict[str, Any]:
    from importlib import metadata

    import torch
    import zmq

    model = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mooncake = None
    for dist in ("mooncake-transfer-engine-non-cuda", "mooncake-transfer-engine"):
        try:
            mooncake = f"{dist} {metadata.version(dist)}"
            break
        except metadata.PackageNotFoundError:
            pass
    return {"cpu_model": model, "cores": os.cpu_count(), "kernel": platform.release(),
            "os": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "pyzmq": zmq.__version__,
            "libzmq": zmq.zmq_version(), "mooncake": mooncake,
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}
