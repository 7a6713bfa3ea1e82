"""Where one prefill step of the AR engine goes on CUDA (issue #44 item 1): the engine
loaded in this process, fed BATCH fresh prompts of LEN random token ids (the step takes
them all, as the server's first step of a burst does), profiled with torch.profiler.

`python bench/probes/prefill_profile.py MODEL_DIR [BATCHxLEN ...] [--option K=V ...]`
(default 8x2048 1x8192). For each shape: the step's wall time (median of 3 fresh bursts
after one warm-up burst), prompt tokens/s, the sum of the GPU's kernel time inside it
(the rest of the wall is the GPU waiting on the host), and the top kernels by GPU time,
grouped as matmul / attention / other, so a server's prefill can be read against
prefill_ceiling.py's plain-PyTorch figure for the same shape.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from omni.engines.ar.engine import AREngine
from omni.engines.base import EngineRequest

GROUPS = (("matmul", ("gemm", "sm90", "cutlass", "nvjet", "matmul")),
          ("attention", ("flash", "fmha", "attention", "attn")))


def _burst(engine: AREngine, batch: int, length: int, tag: str) -> float:
    rng = random.Random(tag)
    for i in range(batch):
        ids = [rng.randrange(100, engine.lm.vocab_size - 100) for _ in range(length)]
        engine.add(EngineRequest(f"{tag}-{i}", {"prompt_token_ids": ids},
                                 {"temperature": 0, "max_tokens": 1, "ignore_eos": True}))
    _sync()
    start = time.perf_counter()
    started: set[str] = set()
    while len(started) < batch:  # every prompt's first token
        for o in engine.step():
            if o.error is not None:
                raise RuntimeError(f"{o.request_id}: {o.error}")
            if o.data and o.data.get("token_ids"):
                started.add(o.request_id)
    while engine.has_work():  # their finish (max_tokens 1): nothing left for the next burst
        engine.step()
    _sync()
    return time.perf_counter() - start


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _group(name: str) -> str:
    lowered = name.lower()
    return next((g for g, keys in GROUPS if any(k in lowered for k in keys)), "other")


def measure(engine: AREngine, batch: int, length: int) -> None:
    _burst(engine, batch, length, f"warm{batch}x{length}")
    walls = [_burst(engine, batch, length, f"b{batch}x{length}-{r}") for r in range(3)]
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        _burst(engine, batch, length, f"p{batch}x{length}")
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    gpu_us = sum(e.self_device_time_total for e in kernels)
    wall = statistics.median(walls)
    print(f"[prefill_profile] {batch}x{length}: wall {wall * 1e3:.1f} ms "
          f"({batch * length / wall:,.0f} prompt tok/s; walls {[round(w * 1e3, 1) for w in walls]}), "
          f"GPU kernels {gpu_us / 1e3:.1f} ms in the profiled burst")
    by_group: dict[str, float] = {}
    for e in kernels:
        by_group[_group(e.key)] = by_group.get(_group(e.key), 0.0) + e.self_device_time_total
    print("[prefill_profile]   by group (ms): " + ", ".join(
        f"{g} {us / 1e3:.1f}" for g, us in sorted(by_group.items(), key=lambda kv: -kv[1])))
    for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:12]:
        print(f"[prefill_profile]   {e.self_device_time_total / 1e3:8.2f} ms x{e.count:<5} "
              f"{_group(e.key):9} {e.key[:100]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("shapes", nargs="*", default=["8x2048", "1x8192"])
    parser.add_argument("--device", default="cuda", help="cuda (cpu: a dry run)")
    parser.add_argument("--option", action="append", default=[], metavar="K=V")
    args = parser.parse_args()
    import yaml
    options = {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in args.option)}
    engine = AREngine(args.model, device=args.device, dtype="bfloat16", options=options)
    for shape in args.shapes:
        batch, length = (int(x) for x in shape.split("x"))
        measure(engine, batch, length)


if __name__ == "__main__":
    main()
