"""ours: omni.AsyncOmni on uvloop serving a linear echo pipeline s0 -> ... -> s{N-1}."""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from bench.common import PROMPT, progress, say, summarize


def pipeline_dict(n: int) -> dict[str, Any]:
    names = [f"s{i}" for i in range(n)]
    stages: list[dict[str, Any]] = [{"name": name, "engine": "echo"} for name in names]
    stages[-1]["final_output"] = "text"
    edges = [{"from": a, "to": b, "delivery": "full"}
             for a, b in zip(names, names[1:], strict=False)]
    return {"name": f"bench-echo-{n}", "stages": stages, "edges": edges}


async def bench_ours(n: int, args: argparse.Namespace, *, concurrency: int) -> dict[str, Any]:
    """Latency = generate() call to the finished output; one client, or `concurrency`."""
    from omni import AsyncOmni
    from omni.config.pipeline import parse_pipeline

    label = f"ours N={n}" + (f" c={concurrency}" if concurrency > 1 else "")
    cfg = parse_pipeline(pipeline_dict(n), source="bench")
    t_start = time.monotonic()
    async with AsyncOmni(cfg, log_level=logging.WARNING) as omni:
        startup_s = time.monotonic() - t_start
        await _check_one(omni, [f"s{i}" for i in range(n)])
        clock = time.perf_counter_ns

        async def one() -> int:
            t0 = clock()
            async for out in omni.generate({"prompt": PROMPT}):
                if out.finished:
                    return clock() - t0
            raise RuntimeError("generate() ended without a finished output")

        if concurrency == 1:
            samples: list[int] = []
            total = args.warmup + args.requests
            for i in range(total):
                latency = await one()
                if i >= args.warmup:
                    samples.append(latency)
                progress(label, i + 1, total, args.progress_every, samples)
            stats = summarize(samples)
        else:
            stats = await _concurrent(one, label, concurrency, args)
    stats["startup_s"] = round(startup_s, 2)
    stats["stages"] = n
    stats["concurrency"] = concurrency
    say(f"[{label}] p50 {stats['p50_us']:.1f} us  p99 {stats['p99_us']:.1f} us"
        + (f"  {stats['throughput_rps']:.0f} req/s" if concurrency > 1 else ""))
    return stats


async def _check_one(omni: Any, expected: list[str]) -> None:
    outputs = [out async for out in omni.generate({"prompt": PROMPT})]
    data = [o.data for o in outputs if o.data is not None]
    if not outputs[-1].finished or not data or data[-1]["trace"] != expected \
            or "".join(d["text"] for d in data) != PROMPT:
        raise RuntimeError(f"unexpected pipeline output: {outputs}")


async def _concurrent(one: Callable[[], Any], label: str, concurrency: int,
                      args: argparse.Namespace) -> dict[str, Any]:
    """`concurrency` client tasks, each sending requests back to back."""

    async def phase(count: int, samples: list[int] | None) -> float:
        left = [count]

        async def client() -> None:
            while left[0] > 0:
                left[0] -= 1
                latency = await one()
                if samples is not None:
                    samples.append(latency)
                    progress(label, len(samples), count, args.progress_every, samples)

        t0 = time.perf_counter_ns()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return (time.perf_counter_ns() - t0) / 1e9

    await phase(args.warmup, None)
    samples: list[int] = []
    wall_s = await phase(args.requests, samples)
    stats = summarize(samples)
    stats["wall_s"] = round(wall_s, 3)
    stats["throughput_rps"] = round(len(samples) / wall_s, 1)
    return stats
