"""Where a slow first mixed step goes: prompts joining while other sequences decode.

`python bench/probes/mixed_step.py MODEL_DIR [ROUNDS]` (CUDA): an AREngine as the server
loads it (bf16, defaults), then per round: R sequences start and decode a few steps, then
J new 128-token prompts join (a step of J prompts beside R decode rows), for (R, J) in
(1, 7), (6, 2), (3, 5), each round with fresh prompts. Prints every step() call slower than
50 ms with its composition; the first round's slow step is profiled (top CUDA and CPU
ops), so a first-use cost (a kernel compiled or loaded for a new shape) shows by name.
"""

from __future__ import annotations

import os
import random
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from omni.engines.ar.engine import AREngine  # noqa: E402
from omni.engines.base import EngineRequest  # noqa: E402

PARAMS = {"temperature": 0, "max_tokens": 64, "ignore_eos": True}


def _prompt(rng: random.Random) -> dict:
    return {"prompt_token_ids": [rng.randrange(100, 30000) for _ in range(128)]}


def _steps(engine: AREngine, n: int, label: str, profile: bool = False) -> None:
    profiler = None
    if profile:  # the first three calls: the joining prompts' step is one of them
        from torch.profiler import ProfilerActivity, profile as prof  # noqa: I001
        profiler = prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        profiler.__enter__()
    for i in range(n):
        if profiler is not None and i == 3:
            profiler.__exit__(None, None, None)
            print(profiler.key_averages().table(sort_by="cpu_time_total", row_limit=15))
            profiler = None
        if not engine.has_work():
            break
        rows, waiting = len(engine.scheduler.running), len(engine.scheduler.waiting)
        torch.cuda.synchronize()
        started = time.perf_counter()
        engine.step()
        torch.cuda.synchronize()
        took = (time.perf_counter() - started) * 1e3
        if took > 50 or i < 3:
            print(f"{label} step {i}: {took:.1f} ms (running {rows}, waiting {waiting})",
                  flush=True)


def main() -> None:
    model, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2
    started = time.perf_counter()
    engine = AREngine(model, device="cuda", dtype="bfloat16")
    print(f"loaded in {time.perf_counter() - started:.1f} s; info {engine.info()}", flush=True)
    rng = random.Random(0)
    n = 0
    for r in range(rounds):
        for running, joining in ((1, 7), (6, 2), (3, 5)):
            for _ in range(running):
                engine.add(EngineRequest(f"r{n}", _prompt(rng), PARAMS))
                n += 1
            _steps(engine, 4, f"round {r} ({running} alone)")
            for _ in range(joining):
                engine.add(EngineRequest(f"r{n}", _prompt(rng), PARAMS))
                n += 1
            _steps(engine, 200, f"round {r} ({running}+{joining})",
                   profile=(r == 0 and running in (1, 6)))


if __name__ == "__main__":
    main()
