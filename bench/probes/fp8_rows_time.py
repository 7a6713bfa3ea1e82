"""Per-row fp8 activation quantization on CUDA: the fused Triton kernel (fp8_rows.py) vs
the PyTorch form, per call, at a diffusion transformer's and a decode step's shapes.
Prints one line per shape: rows x width, microseconds a call for each, both measured
with CUDA events over 200 calls after 20 warm-up calls (GPU time), and wall time per call
with a synchronize only at the end (what an eager model's host pays to launch it)."""

from __future__ import annotations

import time

import torch

from omni.engines.quantization import fp8, fp8_rows


def torch_form(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / fp8.FP8_MAX
    return (x.float() / scale).clamp(-fp8.FP8_MAX, fp8.FP8_MAX).to(fp8.FP8), scale


def fused(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return fp8_rows.quantize_rows_fused(x, fp8.FP8)


def timed(fn, x: torch.Tensor, calls: int = 200) -> tuple[float, float]:
    for _ in range(20):
        fn(x)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    wall = time.perf_counter()
    start.record()
    for _ in range(calls):
        fn(x)
    end.record()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - wall) / calls * 1e6
    return start.elapsed_time(end) / calls * 1e3, wall


def main() -> None:
    for rows, width in [(1, 4096), (64, 4096), (1100, 3072), (4400, 3072), (17600, 3072),
                        (17600, 12288)]:
        x = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)
        same = torch.equal(fused(x)[0].view(torch.uint8), torch_form(x)[0].view(torch.uint8))
        (tg, tw), (fg, fw) = timed(torch_form, x), timed(fused, x)
        print(f"[fp8_rows] {rows}x{width}: torch {tg:.1f} us GPU / {tw:.1f} us wall, "
              f"fused {fg:.1f} / {fw:.1f}; bitwise equal {same}", flush=True)


if __name__ == "__main__":
    main()
