"""Qwen3-TTS's talker on the AR engine, in-process: where a decode step's time goes.

The feedback AR engine (omni/models/qwen3_tts_talker.py) on a model directory (a
release-shape random build on a GPU box: bench/qwen3_tts.py's fixture), greedy, in the
qwen3-tts environment. For each batch size B, B requests start together; once all are
decoding the probe times --steps engine steps: the whole step (wall, the device synchronised
after it), the feed's code-predictor call (TTSFeed.feedback, synchronised around it), and
the rest (the talker's graphed forward, sampling, the engine's host work); then the same
steps free-running (no synchronisation inside a step), the frames read right after the
code predictor (as before omni/models/qwen3_tts_talker.py's FrameCodes) or when the outputs
are built, after the next step is launched (now). The code
predictor's layers compiled inside its graphs or not (--compile both: each in turn).

--profile B then runs the last variant's steps at batch B as the engine runs them (no
synchronisation inside a step) under torch.profiler: the wall time a step, the GPU's busy
time a step (the union of its kernels' intervals) and so the time the GPU idles waiting for
the host, which overlapping steps (the text engine's chained decode) could hide; and the
kernels that take the GPU's time.

    /tmp/envs/qwen3-tts/bin/python bench/probes/qwen3_tts_ar_step.py --model DIR
        [--batch 1,8,64] [--steps 30] [--compile both] [--kv-cache off] [--device cuda]
        [--profile B]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TEXT = "The ship sailed north across the cold sea, carrying wheat, wool, iron and passengers."


def run(engine: Any, batch: int, steps: int, sync: Any) -> dict[str, float]:
    spent: dict[str, list[float]] = defaultdict(list)
    feedback = engine.feed.feedback

    def timed_feedback(*args: Any, **kwargs: Any) -> Any:
        sync()
        t0 = time.perf_counter()
        out = feedback(*args, **kwargs)
        sync()
        spent["predictor"].append(time.perf_counter() - t0)
        return out

    engine.feed.feedback = timed_feedback
    start_decoding(engine, batch, steps)
    spent.clear()
    sync()
    for _ in range(steps):
        t0 = time.perf_counter()
        outs = engine.step()
        sync()
        spent["step"].append(time.perf_counter() - t0)
        assert all(o.error is None for o in outs), [o.error for o in outs]
    engine.abort(list(engine._seqs))
    while engine.has_work():
        engine.step()
    engine.feed.feedback = feedback
    step = statistics.mean(spent["step"]) * 1e3
    predictor = statistics.mean(spent["predictor"]) * 1e3
    return {"batch": batch, "step_ms": step, "predictor_ms": predictor,
            "rest_ms": step - predictor, "frames_per_s": batch / step * 1e3}


def free_run(engine: Any, batch: int, steps: int, sync: Any, read_now: bool) -> float:
    """ms a step as the engine runs them (no synchronisation inside a step). read_now: each
    step's frames read right after the code predictor, before the next step is launched
    (as before FrameCodes: omni/models/qwen3_tts_talker.py), else when they are emitted."""
    feedback = engine.feed.feedback

    def read_at_once(states: Any, *args: Any, **kwargs: Any) -> Any:
        out = feedback(states, *args, **kwargs)
        if states:
            states[0].frame.rows()
        return out

    if read_now:
        engine.feed.feedback = read_at_once
    try:
        start_decoding(engine, batch, steps)
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        sync()
        took = (time.perf_counter() - t0) / steps * 1e3
    finally:
        engine.feed.feedback = feedback
    engine.abort(list(engine._seqs))
    while engine.has_work():
        engine.step()
    return took


def start_decoding(engine: Any, batch: int, steps: int) -> None:
    """batch requests started together, each prefilled and three steps into decoding, with
    room for ``steps`` more."""
    from omni.engines.base import EngineRequest

    for i in range(batch):
        engine.add(EngineRequest(f"b{batch}-{i}-{time.monotonic_ns()}", {"text": TEXT},
                                 {"temperature": 0, "max_tokens": steps + 40}))
    while any(not seq.output for seq in engine._seqs.values()):  # every prompt prefilled
        engine.step()
    for _ in range(3):
        engine.step()


def profile(engine: Any, batch: int, steps: int) -> None:
    """Wall vs GPU-busy time of the engine's own steps at ``batch`` (module doc)."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    cuda = torch.cuda.is_available()  # else a dry run: no GPU time
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    start_decoding(engine, batch, steps)
    sync()
    with prof(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda) as p:
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        sync()
        wall = (time.perf_counter() - t0) / steps * 1e3
    engine.abort(list(engine._seqs))
    while engine.has_work():
        engine.step()
    kernels = sorted((e.time_range.start, e.time_range.end) for e in p.events()
                     if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start)
    busy, end = 0.0, float("-inf")
    for a, b in kernels:  # the union of the intervals: overlapping kernels count once
        busy += max(0.0, b - max(a, end))
        end = max(end, b)
    busy_ms = busy / 1e3 / steps
    print(f"(profile, B={batch}: step wall {wall:.2f} ms, GPU busy {busy_ms:.2f} ms, idle "
          f"{wall - busy_ms:.2f} ms ({(wall - busy_ms) / wall:.0%}); "
          f"{len(kernels) / steps:.0f} GPU ops a step)", flush=True)
    print(p.key_averages().table(sort_by="device_time_total", row_limit=25,
                                 max_name_column_width=70), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", default="1,8,64")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--compile", default="both", choices=("both", "on", "off"))
    parser.add_argument("--kv-cache", default="off", choices=("both", "on", "off"),
                        help="the predictor over its static KV cache (stage option predictor_kv_cache)")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run (float32)")
    parser.add_argument("--profile", type=int, default=0, metavar="B",
                        help="then profile the last variant's steps at batch B (module doc)")
    args = parser.parse_args()
    import torch

    from omni.engines.ar.feedback import FeedbackAREngine

    batches = [int(b) for b in args.batch.split(",")]
    print("| predictor layers | predictor loop | B | step ms | code predictor ms | rest ms "
          "| frames/s | free-running step ms, frames read at the step | the same, read at "
          "emit |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    flags = {"both": (False, True), "on": (True,), "off": (False,)}
    for compiled, cached in ((c, k) for c in flags[args.compile] for k in flags[args.kv_cache]):
        engine = FeedbackAREngine(
            "qwen3_tts_ar_talker", args.model, device=args.device,
            dtype="bfloat16" if args.device == "cuda" else "float32",
            options={"subtalker_dosample": False, "predictor_compile": compiled,
                     "predictor_kv_cache": cached,
                     "max_num_seqs": max(batches), "kv_cache_mb": 4096})
        for batch in batches:
            sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
            r = run(engine, batch, args.steps, sync)
            now, later = (free_run(engine, batch, args.steps, sync, read_now)
                          for read_now in (True, False))
            print(f"| {'compiled' if compiled else 'eager'} | "
                  f"{'static KV' if cached else 'uncached'} | {batch} | {r['step_ms']:.1f} | "
                  f"{r['predictor_ms']:.1f} | {r['rest_ms']:.1f} | {r['frames_per_s']:.0f} | "
                  f"{now:.2f} | {later:.2f} |", flush=True)
        if args.profile and (compiled, cached) == (
                flags[args.compile][-1], flags[args.kv_cache][-1]):
            profile(engine, args.profile, args.steps)
        del engine
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
