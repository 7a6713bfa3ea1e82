"""Orchestrator overhead per hop: echo pipelines served by AsyncOmni vs baselines.

A *hop* is one stage's round trip through the orchestrator: ADD sent on the pipeline's
ZeroMQ ROUTER to the replica's DEALER (ipc), the engine process runs one step, OUTPUTS
comes back the same way, the orchestrator routes it. A linear pipeline of N echo stages
makes N hops per request.

Measured, in one run, one request at a time (concurrency 1) unless said otherwise:

  A     in-process: N EchoEngines chained in this process, no sockets (add + step until
        finished, the output fed to the next engine) -> the engine work itself.
  B0    raw Unix socket: a blocking Unix stream socket server here, a spawned child with
        a bare echo loop, the same messages behind a 4-byte length -> a plain stream
        socket (the transport omni used before ZeroMQ), a baseline.
  B     raw ZeroMQ: a ROUTER here, a DEALER in a spawned child with a bare echo loop,
        ipc, one frame per message -> the runtime's socket pattern without the runtime.
  B2    the real engine process: a ROUTER bound as the orchestrator binds it, driving
        run_engine_process() + EchoEngine (identity s/0@0) -> B plus the engine's loop.
  idle  B0, B and B2 again, the client sleeping --idle-gap-us before each round trip:
        the peer has gone idle, as every stage of an N-stage pipeline is while the
        others run -> what waking an idle process costs on each transport.
  ours  omni.AsyncOmni on uvloop serving s0 -> s1 -> ... -> s{N-1} (echo stages, full
        edges, the last stage final_output text) over ZeroMQ; latency = generate() call
        to the finished output. Plus one run at concurrency 8 for N=4 (throughput).

per-hop overhead(N) = (ours(N) - A(N)) / N    slope = (ours(Nmax) - ours(Nmin)) / (Nmax - Nmin)
Targets: per-hop p50 <= 150 us; per-hop p50 - B p50 (what the runtime adds to raw
ZeroMQ) against a previous run's per-hop p50 - B0 p50 (what it added to its raw Unix
socket), given with --before. Writes core.md (report) and core.json (raw samples).
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import json
import logging
import os
import pstats
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import baselines, report
from bench.common import (
    CONCURRENCY,
    CONCURRENCY_STAGES,
    PROMPT,
    TARGET_US,
    cpu_times,
    hardware,
    say,
    steal_share,
)
from bench.ours import bench_ours

DESCRIPTION = __doc__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stages", default="1,2,4,8", type=_int_list, metavar="N,N,...",
        help="pipeline lengths to measure for A and ours, comma separated (default: "
             "1,2,4,8); the slope uses the smallest and largest")
    parser.add_argument(
        "--requests", default=2000, type=_positive_int, metavar="R",
        help="measured requests per configuration (every row), after warmup (default: 2000)")
    parser.add_argument(
        "--warmup", default=200, type=_non_negative_int, metavar="W",
        help="requests sent first and dropped from every configuration (default: 200)")
    parser.add_argument(
        "--idle-gap-us", default=2000, type=_non_negative_int, metavar="US",
        help="the idle baselines' sleep before each round trip, in microseconds (default: "
             "2000, about how long a stage of the 8-stage pipeline waits for its turn; 0 "
             "skips the idle rows)")
    parser.add_argument(
        "--out", default="bench/results", type=Path, metavar="DIR",
        help="directory for core.md and core.json, created if missing; existing files are "
             "overwritten (default: bench/results)")
    parser.add_argument(
        "--progress-every", default=500, type=_positive_int, metavar="K",
        help="print progress (with the recent p50) to stderr every K requests of a "
             "configuration (default: 500)")
    parser.add_argument(
        "--no-concurrency", action="store_true",
        help=f"skip the concurrency-{CONCURRENCY} throughput run at N={CONCURRENCY_STAGES}")
    parser.add_argument(
        "--before", metavar="FILE|REV:PATH",
        help="a previous run's core.json (a file, or REV:PATH read with git show, e.g. "
             "227b0c6:bench/results/core.json) to compare with: the report gets a before / "
             "now table (per-hop p50 and p99, the baselines, per-hop minus the transport)")
    parser.add_argument(
        "--before-label", default="before", metavar="TEXT",
        help="what the --before run was, for the report (default: before)")
    parser.add_argument(
        "--profile", type=Path, metavar="FILE",
        help="instead of the benchmark: run ours once per --stages under cProfile (the "
             "orchestrator process only, not the engines), save the stats to FILE, print "
             "the top functions; latencies under the profiler are inflated and nothing is "
             "written to --out")


def _load_before(source: str) -> dict[str, Any]:
    """A previous core.json: a file, or REV:PATH read with `git show`."""
    if not Path(source).is_file() and ":" in source:
        return json.loads(subprocess.run(["git", "show", source], check=True,
                                         capture_output=True, text=True).stdout)
    return json.loads(Path(source).read_text())


def run(args: argparse.Namespace, argv: list[str]) -> int:
    os.environ["OMP_NUM_THREADS"] = "1"
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    import uvloop

    if args.profile:
        return _profile(args, uvloop)
    previous = _load_before(args.before) if args.before else None  # fail before the run
    started, ticks = time.monotonic(), cpu_times()
    results: dict[str, Any] = {
        "command": "python -m bench " + shlex.join(argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "hardware": hardware(),
        "settings": {"stages": args.stages, "requests": args.requests, "warmup": args.warmup,
                     "prompt_chars": len(PROMPT), "target_us_per_hop": TARGET_US,
                     "idle_gap_us": args.idle_gap_us,
                     "OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"]},
    }
    say(f"core overhead: stages {args.stages}, {args.requests} requests + "
        f"{args.warmup} warmup each; load average {results['hardware']['loadavg_at_start']}")
    results["inprocess"] = {str(n): baselines.bench_inprocess(n, args) for n in args.stages}
    results["unix_socket"] = baselines.bench_unix(args)
    results["zmq"] = baselines.bench_zmq(args, engine=False)
    results["engine_process"] = baselines.bench_zmq(args, engine=True)
    if args.idle_gap_us:
        gap_s = args.idle_gap_us / 1e6
        results["unix_socket_idle"] = baselines.bench_unix(args, gap_s)
        results["zmq_idle"] = baselines.bench_zmq(args, engine=False, gap_s=gap_s)
        results["engine_process_idle"] = baselines.bench_zmq(args, engine=True, gap_s=gap_s)
    results["ours"] = {}
    results["ours_concurrent"] = None

    async def serve_all() -> None:
        for n in args.stages:
            results["ours"][str(n)] = await bench_ours(n, args, concurrency=1)
        if not args.no_concurrency:
            results["ours_concurrent"] = await bench_ours(CONCURRENCY_STAGES, args,
                                                          concurrency=CONCURRENCY)

    uvloop.run(serve_all())
    results["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results["cpu_steal_share"] = steal_share(ticks, cpu_times())
    results["derived"] = report.derive(results, args.stages)
    if previous is not None:
        results["before"] = report.before(previous, args.before_label, args.before)
    results["wall_s"] = round(time.monotonic() - started, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "core.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "core.md").write_text(report.render_markdown(results))
    say(f"done in {results['wall_s']} s -> {args.out / 'core.md'}, {args.out / 'core.json'}")
    say(report.summary_lines(results))
    return 0


def _profile(args: argparse.Namespace, uvloop: Any) -> int:
    profiler = cProfile.Profile()

    async def serve() -> None:
        for n in args.stages:
            await bench_ours(n, args, concurrency=1)

    profiler.enable()
    uvloop.run(serve())
    profiler.disable()
    args.profile.parent.mkdir(parents=True, exist_ok=True)
    profiler.dump_stats(str(args.profile))
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(40)
    say(f"profile saved to {args.profile} (python -m pstats {args.profile})")
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _int_list(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected N,N,... got {text!r}") from exc
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"stage counts must be >= 1, got {text!r}")
    return values
