#!/usr/bin/env python
"""Where one step of the Qwen3-Omni talker stage spends its time, at several batch sizes,
eager and under CUDA graphs.

    python scripts/profile_talker_step.py --model DIR [--batch 1,8,32] [--steps 20] [--graphs]

Runs the thinker (exporting hidden states) for one answer, then the talker engine
in-process with B requests fed that whole answer, and times each decode step and, with
CUDA synchronisation around them, its two model parts: the talker's forward (first code)
and the code predictor (the residual codes, one small forward per code group).
With --graphs (CUDA) it repeats this for each graph mode (the code-predictor loop
captured: feed_cuda_graphs; then the talker's decode too: cuda_graphs, with and without
compile_decode), first checking each mode's greedy frames against the eager engine's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from omni.engines.ar.engine import AREngine  # noqa: E402
from omni.engines.ar.feedback import FeedbackAREngine  # noqa: E402
from omni.engines.base import EngineRequest  # noqa: E402


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(spent: list[float], fn):
    def wrapper(*args, **kwargs):
        _sync()
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        _sync()
        spent.append(time.perf_counter() - start)
        return out
    return wrapper


def thinker_answer(model: str, device: str, memory: int, tokens: int,
                   options: dict | None = None) -> list:
    thinker = AREngine(model, device=device, memory_bytes=memory,
                       options={"export_hidden_layers": "auto", **(options or {})})
    thinker.add(EngineRequest("t", {"messages": [{"role": "user", "content": "Tell me a story "
                                                  "about the sea and the wind."}]},
                              {"max_tokens": tokens, "ignore_eos": True, "temperature": 0}))
    outs = []
    while thinker.has_work():
        outs += [(o.data, o.finished) for o in thinker.step()]
    if thinker.graphs is not None:
        print(f"[thinker] {thinker.graphs.replays} decode steps replayed from graphs")
    thinker.shutdown()
    del thinker
    torch.cuda.empty_cache()
    return outs


def compare_thinker(args: argparse.Namespace, tokens: int) -> None:
    """The thinker's tokens and exported hidden states, eager vs graphed decode."""
    memory = int(args.thinker_memory_gib * 2**30)
    runs = {name: thinker_answer(args.model, args.device, memory, tokens, options)
            for name, options in (("eager", {"cuda_graphs": False}),
                                  ("graphs", {"compile_decode": False}),
                                  ("graphs-compiled", {}))}
    ref = runs.pop("eager")
    for name, outs in runs.items():
        same = [a[0]["token_ids"] == b[0]["token_ids"] for a, b in zip(outs, ref, strict=True)]
        diff = max((a[0]["hidden_states"].float() - b[0]["hidden_states"].float()).abs().max()
                   .item() for a, b in zip(outs, ref, strict=True) if b[0].get("hidden_states")
                   is not None)
        print(f"[thinker {name}] tokens equal to eager: {sum(same)}/{len(same)}, exported "
              f"hidden states max |diff| {diff:.3g}", flush=True)


def profile(talker: FeedbackAREngine, feed: list, batch: int, steps: int) -> dict[str, float]:
    for i in range(batch):
        rid = f"b{batch}-{i}"
        talker.add(EngineRequest(rid, {"stream": ["thinker"]},
                                 {"max_tokens": steps + 8, "ignore_eos": True,
                                  "temperature": 0.9, "top_k": 50, "seed": i}))
        for seq, (data, last) in enumerate(feed):
            talker.append(rid, "thinker", seq, data, last)
    for _ in range(3):  # prefills and the first decodes
        talker.step()
    forward, predictor, step = [], [], []
    talker._forward = timed(forward, talker._forward)
    talker.feed.feedback = timed(predictor, talker.feed.feedback)
    for _ in range(steps):
        _sync()
        start = time.perf_counter()
        talker.step()
        _sync()
        step.append(time.perf_counter() - start)
    del talker._forward, talker.feed.feedback  # back to the class methods
    talker.abort([f"b{batch}-{i}" for i in range(batch)])
    while talker.has_work():
        talker.step()
    ms = {name: 1e3 * statistics.median(v)
          for name, v in (("step", step), ("talker_forward", forward),
                          ("code_predictor", predictor))}
    ms["other"] = ms["step"] - ms["talker_forward"] - ms["code_predictor"]
    return ms


def greedy_frames(talker: FeedbackAREngine, feed: list, steps: int) -> list[list[int]]:
    """Two greedy requests fed the whole answer: each one's codec frames."""
    frames: dict[str, list] = {"g0": [], "g1": []}
    for rid in frames:
        talker.add(EngineRequest(rid, {"stream": ["thinker"]},
                                 {"max_tokens": steps, "ignore_eos": True, "temperature": 0}))
        for seq, (data, last) in enumerate(feed):
            talker.append(rid, "thinker", seq, data, last)
    while talker.has_work():
        for o in talker.step():
            assert o.error is None, o.error
            if o.data and o.data.get("codes"):
                frames[o.request_id].append([c[0] for c in o.data["codes"]])
    return frames["g0"] + frames["g1"]


MODES = {"eager": {"cuda_graphs": False, "feed_cuda_graphs": False},
         "predictor-graphs": {"cuda_graphs": False, "feed_cuda_graphs": True},
         "all-graphs": {"cuda_graphs": True, "compile_decode": False, "feed_cuda_graphs": True},
         "all-graphs-compiled": {"cuda_graphs": True, "compile_decode": True,
                                 "feed_cuda_graphs": True}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a Qwen3-Omni release directory")
    parser.add_argument("--batch", default="1,8,32", help="batch sizes (default 1,8,32)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per batch size")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--thinker-memory-gib", type=float, default=36)
    parser.add_argument("--talker-memory-gib", type=float, default=10)
    parser.add_argument("--modes", default=",".join(MODES),
                        help="talker modes to time (default: all of " + ",".join(MODES) + ")")
    parser.add_argument("--graphs", action="store_true",
                        help="then the CUDA graph modes (" + ", ".join(list(MODES)[1:]) + ")")
    args = parser.parse_args()
    feed = thinker_answer(args.model, args.device, int(args.thinker_memory_gib * 2**30),
                          args.steps + 16)
    talker = FeedbackAREngine("qwen3_omni_talker", args.model, device=args.device,
                              memory_bytes=int(args.talker_memory_gib * 2**30))
    if args.graphs:
        compare_thinker(args, args.steps + 16)
    batches = [int(b) for b in args.batch.split(",")]
    reference = None
    for mode, options in MODES.items():
        if (mode != "eager" and not args.graphs) or mode not in args.modes.split(","):
            continue
        started = time.perf_counter()
        talker = FeedbackAREngine("qwen3_omni_talker", args.model, device=args.device,
                                  memory_bytes=int(args.talker_memory_gib * 2**30),
                                  options={**options, "max_num_seqs": max(batches)})
        print(f"[{mode}] engine ready in {time.perf_counter() - started:.1f} s; decode "
              f"graphs {talker.graphs is not None}, predictor graphs "
              f"{talker.feed.graphs is not None}", flush=True)
        frames = greedy_frames(talker, feed, 24)
        if reference is None:
            reference = frames
        else:
            pairs = list(zip(frames, reference, strict=True))
            same = sum(a == b for x, y in pairs for a, b in zip(x, y, strict=True))
            total = sum(len(x) for x in reference)
            first = next((i for i, (x, y) in enumerate(pairs) if x != y), None)
            print(f"[{mode}] greedy codes equal to eager: {same}/{total} (first differing "
                  f"frame: {first})", flush=True)
        print(f"[{mode}] batch | step ms | talker forward ms | code predictor ms | other ms | "
              "frames/s")
        for batch in batches:
            ms = profile(talker, feed, batch, args.steps)
            print(f"{batch} | {ms['step']:.2f} | {ms['talker_forward']:.2f} | "
                  f"{ms['code_predictor']:.2f} | {ms['other']:.2f} | "
                  f"{1e3 * batch / ms['step']:.1f}", flush=True)
        talker.shutdown()
        del talker
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
