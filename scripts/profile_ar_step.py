#!/usr/bin/env python
"""Where one decode step of the AR engine spends its time (GPU or CPU), by phase.

    python scripts/profile_ar_step.py --model DIR [--batch 1,32] [--steps 40]

Runs the engine in-process with B requests of random 128-token prompts, then times the
phases of each decode step with CUDA synchronisation between them: scheduling, the
forward (graph replay or eager), sampling, and emitting outputs (detokenisation).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from omni.engines.ar import AREngine  # noqa: E402
from omni.engines.base import EngineRequest  # noqa: E402
from omni.engines.sampling import sample  # noqa: E402


def profile(engine: AREngine, batch: int, steps: int) -> dict[str, float]:
    rng = random.Random(0)
    for i in range(batch):
        ids = [rng.randrange(1000, 100000) for _ in range(128)]
        engine.add(EngineRequest(f"p{i}", {"prompt_token_ids": ids},
                                 {"temperature": 0, "max_tokens": steps + 8, "ignore_eos": True}))
    for _ in range(3):  # prefill + a few decodes (graph capture happens here)
        engine.step()
    sync = torch.cuda.synchronize
    phases: dict[str, list[float]] = {k: [] for k in ("schedule", "forward", "sample", "emit",
                                                      "step")}
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        b = engine.scheduler.schedule()
        t1 = time.perf_counter()
        seqs, logits = engine._forward(b)
        sync()
        t2 = time.perf_counter()
        engine.scheduler.finish_step(b)
        results = sample(logits.float(), [s.state.sampler for s in seqs], engine._stop_ids())
        sync()
        t3 = time.perf_counter()
        for seq, r in zip(seqs, results, strict=True):
            engine._emit(seq, r)
        t4 = time.perf_counter()
        for name, v in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0), strict=True):
            phases[name].append(v * 1000)
    engine.abort([f"p{i}" for i in range(batch)])
    return {k: round(statistics.median(v), 3) for k, v in phases.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model directory")
    p.add_argument("--batch", default="1,32", help="comma-separated batch sizes (default 1,32)")
    p.add_argument("--steps", type=int, default=40, help="decode steps timed (default 40)")
    p.add_argument("--no-graphs", action="store_true", help="eager forwards, no CUDA graphs")
    p.add_argument("--compile", action="store_true", help="torch.compile the decode forward")
    p.add_argument("--attention-kernel", default="auto", choices=("auto", "triton", "sdpa"),
                   help="decode attention kernel (engine option attention_kernel)")
    p.add_argument("--kernels", type=int, default=0, metavar="N",
                   help="also list the N kernels with the most GPU time over the timed "
                        "steps (torch.profiler)")
    args = p.parse_args()
    engine = AREngine(args.model, device="cuda", dtype="bfloat16",
                      options={"cuda_graphs": not args.no_graphs,
                               "compile_decode": args.compile,
                               "attention_kernel": args.attention_kernel})
    for b in (int(x) for x in args.batch.split(",")):
        if not args.kernels:
            print(f"batch {b}: median ms per phase {profile(engine, b, args.steps)}", flush=True)
            continue
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            phases = profile(engine, b, args.steps)
        print(f"batch {b}: median ms per phase {phases}", flush=True)
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.kernels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
