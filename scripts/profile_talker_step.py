#!/usr/bin/env python
"""Where one step of the Qwen3-Omni talker stage spends its time, at several batch sizes.

    python scripts/profile_talker_step.py --model DIR [--batch 1,8,32] [--steps 20]

Runs the thinker (exporting hidden states) for one answer, then the talker engine
in-process with B requests fed that whole answer, and times each decode step and, with
CUDA synchronisation around them, its two model parts: the talker's forward (first code)
and the code predictor (the residual codes, one small forward per code group).
With --graphs (CUDA) it then captures the code-predictor loop (feed_cuda_graphs), checks
it against the eager loop on the same inputs, and times the steps again.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from omni.engines.ar import AREngine  # noqa: E402
from omni.engines.ar_feedback import FeedbackAREngine  # noqa: E402
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


def thinker_answer(model: str, device: str, memory: int, tokens: int) -> list:
    thinker = AREngine(model, device=device, memory_bytes=memory,
                       options={"export_hidden_layers": "auto"})
    thinker.add(EngineRequest("t", {"messages": [{"role": "user", "content": "Tell me a story "
                                                  "about the sea and the wind."}]},
                              {"max_tokens": tokens, "ignore_eos": True, "temperature": 0}))
    outs = []
    while thinker.has_work():
        outs += [(o.data, o.finished) for o in thinker.step()]
    thinker.shutdown()
    return outs


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
    talker.lm.model.forward = timed(forward, talker.lm.model.forward)
    talker.feed.feedback = timed(predictor, talker.feed.feedback)
    for _ in range(steps):
        _sync()
        start = time.perf_counter()
        talker.step()
        _sync()
        step.append(time.perf_counter() - start)
    del talker.lm.model.forward, talker.feed.feedback  # back to the class methods
    talker.abort([f"b{batch}-{i}" for i in range(batch)])
    while talker.has_work():
        talker.step()
    ms = {name: 1e3 * statistics.median(v)
          for name, v in (("step", step), ("talker_forward", forward),
                          ("code_predictor", predictor))}
    ms["other"] = ms["step"] - ms["talker_forward"] - ms["code_predictor"]
    return ms


@torch.inference_mode()
def compare_graphs(talker: FeedbackAREngine, batch: int) -> str:
    """Greedy and sampled codes of the captured loop against the cached eager loop."""
    from omni.models.qwen3_omni_predictor import predict_cached

    feed, model = talker.feed, talker.lm.model.talker
    gen = torch.Generator(device=talker.lm.device).manual_seed(0)
    emb = model.get_input_embeddings()
    hidden = torch.randn(batch, emb.weight.shape[1], device=emb.weight.device,
                         dtype=emb.weight.dtype, generator=gen)
    first = emb(torch.randint(0, 64, (batch,), device=emb.weight.device, generator=gen))
    draws = torch.rand(batch, feed.num_groups - 1, device=emb.weight.device, generator=gen)
    greedy = torch.arange(batch, device=emb.weight.device) % 2 == 0
    codes, total = feed.graphs.run(hidden, first, draws, greedy)
    ref_codes, ref_total = predict_cached(model.code_predictor, feed.cache_key, hidden, first,
                                          draws, greedy)
    same = (codes == ref_codes).float().mean().item()
    diff = (total.float() - ref_total.float()).abs().max().item()
    return f"graphs vs eager at batch {batch}: {same:.1%} codes equal, max |total diff| {diff:.3g}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a Qwen3-Omni release directory")
    parser.add_argument("--batch", default="1,8,32", help="batch sizes (default 1,8,32)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per batch size")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--thinker-memory-gib", type=float, default=36)
    parser.add_argument("--talker-memory-gib", type=float, default=10)
    parser.add_argument("--graphs", action="store_true",
                        help="then capture the code-predictor loop (CUDA) and run again")
    args = parser.parse_args()
    feed = thinker_answer(args.model, args.device, int(args.thinker_memory_gib * 2**30),
                          args.steps + 16)
    talker = FeedbackAREngine("qwen3_omni_talker", args.model, device=args.device,
                              memory_bytes=int(args.talker_memory_gib * 2**30))
    batches = [int(b) for b in args.batch.split(",")]
    rounds = ["eager"] + (["graphs"] if args.graphs else [])
    for mode in rounds:
        if mode == "graphs":
            if not talker.feed.use_cuda_graphs(max(batches)):
                print("code-predictor graphs unavailable (CPU, or capture failed: see log)")
                break
            for batch in batches:
                print(compare_graphs(talker, batch), flush=True)
        print(f"[{mode}] batch | step ms | talker forward ms | code predictor ms | other ms | "
              "frames/s")
        for batch in batches:
            ms = profile(talker, feed, batch, args.steps)
            print(f"{batch} | {ms['step']:.2f} | {ms['talker_forward']:.2f} | "
                  f"{ms['code_predictor']:.2f} | {ms['other']:.2f} | "
                  f"{1e3 * batch / ms['step']:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
