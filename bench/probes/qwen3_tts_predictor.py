"""Qwen3-TTS's code predictor alone: its captured loop uncached vs over a static KV cache,
layers eager vs compiled, the static loop compiled a layer step (and a pass tail: norm,
head, pick, embedding) at a time vs a whole pass at a time. As served, the layers' q/k/v and gate/up projections are fused first (the AR
engine's omni/engines/ar/fused_projections.py; --separate leaves them apart).

The predictor's 15 passes a frame are captured as one CUDA graph per padded batch
(omni/models/qwen3_omni_predictor.py). The uncached loop recomputes the frame's positions
in each pass (pass g reads g + 2 of them: 135 positions a row a frame); the static loop
(omni/models/predictor_kv.py) reads the earlier ones from per-layer buffers (15 a row).
At batch 64 the predictor took 9.9 of a 14.7 ms talker step (H100,
bench/results/qwen3-tts-ar-step-h100.md). Per variant
and batch size: the mean graph replay (device synchronised), and how many of its greedy
codes equal the first variant's (bf16 arithmetic differs by order, so a few may not).
--variants all adds the eager-layer ones (measured in session 13). Runs in the qwen3-tts environment on a release-shape model directory:

    /tmp/envs/qwen3-tts/bin/python bench/probes/qwen3_tts_predictor.py --model DIR
        [--batch 8,64] [--replays 50]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# (loop, compiled, the static loop's compile unit); the tail compiled beside the layer step
# took 5.19 / 5.81 -> 4.42 / 5.01 ms at B=8 / 64 (H100, session 14)
VARIANTS = (("uncached", True, "-"), ("static", True, "layer"), ("static", True, "pass"))
EAGER = (("uncached", False, "-"), ("static", False, "-"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", default="8,64")
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--variants", choices=("compiled", "all"), default="compiled")
    parser.add_argument("--separate", action="store_true",
                        help="leave q/k/v and gate/up unfused (the AR engine fuses them)")
    parser.add_argument("--profile", type=int, default=0, metavar="B",
                        help="then profile the last variant's loop uncaptured at batch B (a "
                        "captured size): its kernels a frame, by GPU time")
    args = parser.parse_args()
    import torch

    from omni.models.qwen3_omni_predictor import make_graphs
    from omni.models.qwen3_tts import load_qwen3_tts

    tts = load_qwen3_tts(args.model, "cuda", "bfloat16")
    tts.model.requires_grad_(False)
    cp = tts.model.talker.code_predictor
    if not args.separate:
        from omni.engines.ar.fused_projections import fuse_projections
        print(f"(fused projection groups: {fuse_projections(cp)})")
    cfg = tts.model.config.talker_config
    width, groups = int(cfg.hidden_size), int(cfg.num_code_groups)
    batches = [int(b) for b in args.batch.split(",")]
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = {b: (torch.randn(b, width, device="cuda", generator=gen, dtype=torch.bfloat16),
                  torch.randn(b, width, device="cuda", generator=gen, dtype=torch.bfloat16),
                  torch.zeros(b, groups - 1, device="cuda"),
                  torch.ones(b, dtype=torch.bool, device="cuda")) for b in batches}
    print("| loop | layers | compile unit | B | replay ms | codes equal to the first row's |")
    print("|---|---|---|---:|---:|---:|")
    reference: dict[int, torch.Tensor] = {}
    variants = (EAGER if args.variants == "all" else ()) + VARIANTS
    for loop, compiled, unit in variants:
        name = f"{loop} | {'compiled' if compiled else 'eager'} | {unit}"
        t0 = time.perf_counter()
        graphs = make_graphs(cp, width, groups, torch.bfloat16, torch.device("cuda"),
                             max(batches), compiled=compiled,
                             project=cp.small_to_mtp_projection,
                             kv_cache=loop == "static",
                             compile_unit=unit if unit != "-" else "layer")
        built = time.perf_counter() - t0
        if graphs is None or graphs.compiled != compiled:
            print(f"| {name} | - | capture failed (see the warning above) | - |")
            continue
        for b in batches:
            codes, _ = graphs.run(*inputs[b])
            reference.setdefault(b, codes)
            same = (codes == reference[b]).float().mean().item()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.replays):
                graphs.run(*inputs[b])
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) / args.replays * 1e3
            print(f"| {name} | {b} | {ms:.2f} | {same:.3f} |", flush=True)
        print(f"({name}: built in {built:.1f} s)", flush=True)
        if args.profile and (loop, compiled, unit) == variants[-1]:
            profile(graphs, args.profile)
        del graphs
        torch.cuda.empty_cache()
    return 0


def profile(graphs, batch: int) -> None:
    """The kernels of one frame of a variant's loop at ``batch``, run without its graph
    (the kernels a replay runs, plus the launches the graph saves), through the variant's
    own compiled functions (the first try, with fresh torch.compile wrappers, ran aten's
    eager kernels, 4,217 a frame: likely dynamo's recompile limit, not looked into)."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    with torch.inference_mode():
        graphs._loop(batch)
        torch.cuda.synchronize()
        with prof(activities=[ProfilerActivity.CUDA]) as p:
            graphs._loop(batch)
            torch.cuda.synchronize()
    events = [e for e in p.key_averages() if e.device_type.name == "CUDA"]
    kernels = sum(e.count for e in events)
    busy = sum(e.device_time_total for e in events) / 1e3
    print(f"(profile, B={batch}: {kernels} GPU ops a frame, {busy:.2f} ms of GPU time)")
    print(p.key_averages().table(sort_by="device_time_total", row_limit=20,
                                 max_name_column_width=70))


if __name__ == "__main__":
    sys.exit(main())
