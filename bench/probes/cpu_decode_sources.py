"""Versions of the CPU decode kernel's source timed side by side, in one process.

    git show REV:omni/engines/ar/cpu_paged_decode.cpp > /tmp/before.cpp
    OMP_NUM_THREADS=1 python bench/probes/cpu_decode_sources.py /tmp/before.cpp \\
        omni/engines/ar/cpu_paged_decode.cpp [--context 330] [--batch 32] [--calls 400]

Each source is built (cpu_decode_kernel's compiler and flags) with its operator library
renamed (omni_cpu -> omni_cpu_vN), so all load into one process and their calls alternate:
the shared VM's noise falls on each alike. The case is the tiny Qwen3's layer (4 heads, 2 KV
heads x 64, float32), blocks of 16 interleaved across the batch as decode allocates them,
lengths drawn in [context/2, context]. Two timings per call: `hot` (the same call just
before) and `between steps` (another layer's cache and 16 MB of other memory read first,
as a decode step does between two calls of one layer). Prints min and p25 (ms) and each
output's largest difference from SDPA on the gathered rows.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from omni.engines.ar import cpu_decode_kernel

HEADS, KV_HEADS, DIM, BLOCK = 4, 2, 64, 16


def load(sources: list[str]) -> list:
    ops = []
    for i, source in enumerate(sources):
        text = Path(source).read_text().replace("omni_cpu", f"omni_cpu_v{i}")
        work = Path(tempfile.mkdtemp(prefix=f"cpu-decode-v{i}-"))
        out = work / "build"
        out.mkdir()
        renamed = work / f"v{i}.cpp"
        renamed.write_text(text)
        cpu_decode_kernel._compile("c++", renamed, out)
        torch.ops.load_library(str(out / cpu_decode_kernel.LIBRARY))
        ops.append(getattr(torch.ops, f"omni_cpu_v{i}").paged_decode)
    return ops


def case(batch: int, context: int) -> tuple:
    slots_total = 8192 * BLOCK  # the engine's CPU cache: 8192 blocks
    caches = [(torch.randn(slots_total, KV_HEADS, DIM), torch.randn(slots_total, KV_HEADS, DIM))
              for _ in range(2)]
    slots = torch.zeros(batch, 2048, dtype=torch.long)
    for b in range(batch):
        blocks = [b + batch * i for i in range(-(-context // BLOCK))]
        slots[b, :context] = torch.cat([torch.arange(x * BLOCK, (x + 1) * BLOCK)
                                        for x in blocks])[:context]
    lens = torch.randint(context // 2, context + 1, (batch,))
    return caches, slots, lens, torch.randn(HEADS, batch, DIM) * 3


def sdpa(caches: list, slots: torch.Tensor, lens: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    rows = []
    for b in range(q.shape[1]):
        idx = slots[b, :int(lens[b])]
        k, v = (c[idx].transpose(0, 1).repeat_interleave(HEADS // KV_HEADS, 0)
                for c in caches[0])
        rows.append(torch.nn.functional.scaled_dot_product_attention(
            q[:, b:b + 1].unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0))[0, :, 0])
    return torch.stack(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", nargs="+", help="kernel sources to compare")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=330)
    parser.add_argument("--calls", type=int, default=400)
    args = parser.parse_args()
    torch.manual_seed(0)
    ops = load(args.sources)
    caches, slots, lens, q = case(args.batch, args.context)
    other = torch.randn(4 * 1024 * 1024)

    def call(op, layer: int) -> torch.Tensor:
        out = q.new_empty(args.batch, HEADS, DIM)
        op(q, *caches[layer], slots, lens, DIM ** -0.5, 0, out)
        return out

    hot: list[list[float]] = [[] for _ in ops]
    between: list[list[float]] = [[] for _ in ops]
    for _ in range(args.calls):
        for i, op in enumerate(ops):
            call(op, 0)
            t = time.perf_counter()
            call(op, 0)
            hot[i].append(time.perf_counter() - t)
            call(op, 1)
            other.sum()
            t = time.perf_counter()
            call(op, 0)
            between[i].append(time.perf_counter() - t)
    want = sdpa(caches, slots, lens, q)
    for i, source in enumerate(args.sources):
        h, b = sorted(hot[i]), sorted(between[i])
        err = (call(ops[i], 0) - want).abs().max().item()
        print(f"{source}: err {err:.1e}; hot min {h[0] * 1e3:.3f} p25 "
              f"{h[len(h) // 4] * 1e3:.3f} ms; between steps min {b[0] * 1e3:.3f} p25 "
              f"{b[len(b) // 4] * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
