"""Time to READY and memory of a 3-stage pipeline of tiny real models.

Ours starts every stage's process at once and waits on READY and sentinels together. The
baseline starts the same three stages one after another (each a one-stage pipeline,
awaited before the next), the way a launcher that serialises stage start-up behaves.
Memory is read from /proc at READY: the sum of every process's peak RSS (VmHWM; counts
shared library pages once per process) and of PSS (shared pages split fairly).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from bench.common import hardware, say

TARGET_S, TARGET_GIB = 8.0, 1.5
DESCRIPTION = __doc__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stages", type=int, default=3, help="AR stages in the chain "
                        "(default: 3)")
    parser.add_argument("--cache-dir", default=None, help="where the tiny Qwen3 is built "
                        "(default: $OMNI_CACHE_DIR or ~/.cache/omni/models)")
    parser.add_argument("--out", default="bench/results", help="directory for startup.md "
                        "and startup.json (default: bench/results)")


def chain(model_dir: str, n: int, name: str = "chain") -> Any:
    from omni.config.pipeline import parse_pipeline

    stages = [{"name": f"llm{i}", "engine": "ar", "model_dir": model_dir,
               "params": {"max_tokens": 4, "temperature": 0}} for i in range(n)]
    stages[-1]["final_output"] = "text"
    edges = [{"from": f"llm{i}", "to": f"llm{i + 1}"} for i in range(n - 1)]
    return parse_pipeline({"name": name, "stages": stages, "edges": edges})


def _memory(pids: list[int]) -> dict[str, float]:
    hwm = pss = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                hwm += int(line.split()[1])
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss += int(line.split()[1])
    return {"peak_rss_sum_gib": round(hwm / 2**20, 3), "pss_sum_gib": round(pss / 2**20, 3),
            "processes": len(pids)}


async def parallel(model_dir: str, n: int) -> dict[str, Any]:
    from omni import AsyncOmni

    omni = AsyncOmni(chain(model_dir, n))
    started = time.perf_counter()
    await omni.start()
    ready_s = time.perf_counter() - started
    pids = [os.getpid()] + [r.process.pid for r in omni.orchestrator.engines.replicas.values()]
    memory = _memory(pids)
    outputs = [o async for o in omni.generate({"prompt": "hello"})]
    await omni.close()
    return {"ready_s": round(ready_s, 2), **memory, "request_ok": outputs[-1].finished}


async def sequential(model_dir: str, n: int) -> dict[str, Any]:
    """Each stage spawned from scratch (imports included), the next after the last is ready."""
    import multiprocessing

    import omni.runtime.launcher
    from omni import AsyncOmni

    omni.runtime.launcher.process_context = lambda _: multiprocessing.get_context("spawn")
    started, omnis = time.perf_counter(), []
    for i in range(n):
        omni = AsyncOmni(chain(model_dir, 1, name=f"stage{i}"))
        await omni.start()
        omnis.append(omni)
    ready_s = time.perf_counter() - started
    for omni in omnis:
        await omni.close()
    return {"ready_s": round(ready_s, 2)}


def run(args: argparse.Namespace, argv: list[str]) -> int:
    import uvloop

    from omni.fixtures.tiny_models import ensure_tiny_model

    model_dir = str(ensure_tiny_model("qwen3", Path(args.cache_dir) if args.cache_dir else None,
                                      progress=say))
    machine = hardware()
    say(f"[startup] {args.stages} stages in parallel ...")
    ours = uvloop.run(parallel(model_dir, args.stages))
    say(f"[startup] ours: {ours}")
    say(f"[startup] {args.stages} stages one after another ...")
    serial = uvloop.run(sequential(model_dir, args.stages))
    say(f"[startup] sequential: {serial}")
    result = {"command": "python -m bench " + " ".join(argv), "hardware": machine,
              "stages": args.stages, "ours_parallel": ours, "sequential": serial}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "startup.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "startup.md").write_text(_report(result))
    say(f"[startup] wrote {out / 'startup.md'}")
    return 0


def _report(r: dict[str, Any]) -> str:
    o, s, hw = r["ours_parallel"], r["sequential"], r["hardware"]
    ok_t = "meets" if o["ready_s"] <= TARGET_S else "misses"
    ok_m = "meets" if o["pss_sum_gib"] <= TARGET_GIB else "misses"
    return "\n".join([
        f"# Start-up: {r['stages']}-stage pipeline of tiny real models", "",
        f"Command: `{r['command']}`  ",
        f"Machine: {hw['cpu_model']}, {hw['cores_usable']} cores, {hw['ram_gib']} GiB RAM, "
        f"Python {hw['python']}; load average at start {hw['loadavg_at_start']}", "",
        f"Pipeline: {r['stages']} `ar` stages (tiny Qwen3, random weights, CPU, float32) "
        "chained with full edges; each stage is one engine process (torch + transformers).", "",
        "| | time to READY (s) | peak RSS, sum over processes (GiB) | PSS sum at READY (GiB) |",
        "|---|---:|---:|---:|",
        f"| ours: all stages start at once | {o['ready_s']} | {o['peak_rss_sum_gib']} | "
        f"{o['pss_sum_gib']} |",
        f"| baseline: stages spawned from scratch one after another | {s['ready_s']} | | |",
        "",
        f"Target: READY in <= {TARGET_S:g} s ({ok_t}: {o['ready_s']} s) and <= {TARGET_GIB:g} "
        f"GiB ({ok_m} by PSS: {o['pss_sum_gib']} GiB; peak RSS summed per process, which "
        f"counts shared torch pages once per process, is {o['peak_rss_sum_gib']} GiB). "
        f"A request ran through the chain after READY: {o['request_ok']}.", "",
        "Ours forks every engine from a fork server that imported torch and transformers "
        "once (omni/runtime/launcher.py, process_context); the baseline spawns each stage as a "
        "fresh interpreter that imports them itself, and starts the next stage only when the "
        "previous one is ready. The baseline runs second, in the same process, with the "
        "fork server already warm but unused.", ""])
