"""One fp8 linear (quantization.fp8.fp8_linear: the row kernel + torch._scaled_mm) vs
F.linear in bf16 on CUDA, at the shapes of a 20 B diffusion transformer's blocks at batch 1
and 8 (image rows 1024 a 512x512 image, text rows ~20) and of a decode step: where fp8's
batch-1 slowdown comes from (bench/results/fp8-h100.md). Per shape, microseconds a call:
GPU time (CUDA events over 200 calls after 20 warm-up calls) and wall time per call with
one synchronize at the end (what an eager model's host pays), for bf16, the whole fp8
linear, and its two halves (quantizing the rows; the scaled matmul on quantized rows)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from omni.engines.quantization import fp8


def timed(fn: Callable[[], object], calls: int = 200) -> tuple[float, float]:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    wall = time.perf_counter()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - wall) / calls * 1e6
    return start.elapsed_time(end) / calls * 1e3, wall


def shape_row(rows: int, width: int, out: int) -> str:
    """One shape's cells: bf16, the whole fp8 linear and its two halves."""
    x = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(out, width, device="cuda", dtype=torch.bfloat16) * 0.02
    q, scale = fp8.quantize_rows(w)
    xq, x_scale = fp8.quantize_activations(x)
    parts = {
        "bf16": lambda: F.linear(x, w),
        "fp8": lambda: fp8.fp8_linear(x, q, scale, None),
        "quantize": lambda: fp8.quantize_activations(x),
        "scaled_mm": lambda: torch._scaled_mm(xq, q.t(), scale_a=x_scale,
                                              scale_b=scale[None, :],
                                              out_dtype=torch.bfloat16),
        "fast_accum": lambda: torch._scaled_mm(xq, q.t(), scale_a=x_scale,
                                               scale_b=scale[None, :],
                                               out_dtype=torch.bfloat16, use_fast_accum=True),
    }
    cells = []
    for name, fn in parts.items():
        gpu, wall = timed(fn)
        cells.append(f"{name} {gpu:.1f}/{wall:.1f}")
    return f"[fp8_linear] {rows}x{width}->{out} (us GPU/wall): " + ", ".join(cells)


def main() -> None:
    # rows: a decode step (1, 8), a text stream at batch 1 / 4 (16, 20, 32, 80), an image
    # stream at batch 1 / 4 / 8 (1024, 4096, 8192), and 1044 (not a multiple of 16)
    shapes = [(1, 4096, 4096), (8, 4096, 4096), (16, 3072, 3072), (20, 3072, 3072),
              (32, 3072, 3072), (80, 3072, 3072), (20, 3072, 12288), (20, 12288, 3072),
              (1024, 3072, 3072), (1024, 3072, 12288), (1024, 12288, 3072),
              (1044, 3072, 3072), (4096, 3072, 3072), (8192, 3072, 12288)]
    for rows, width, out in shapes:
        print(shape_row(rows, width, out), flush=True)


if __name__ == "__main__":
    main()
