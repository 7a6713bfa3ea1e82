"""Per-row fp8 quantization of activations in one Triton kernel (fp8.py's run-time half).

fp8_linear scales each activation row to e4m3's range before the scaled matmul. Written
as PyTorch ops, that is abs, amax, a float32 copy, a division, a clamp and a cast: six
kernels and as many passes over the activations, three of them in float32, for every
linear layer. On an H100 that made a 20 B diffusion transformer (840 fp8 linears,
512x512, run eagerly) 2.1x slower than bf16 at batch 1 and 1.5x at batch 16
(bench/results/fp8-h100.md). This kernel reads each row twice (its max, then the scaled
values) and writes the fp8 row and its scale: one launch, no float32 copy.

Same arithmetic as the PyTorch path (fp8.quantize_activations): the scale is
max(|x|) / 448 in float32 (at least 1e-12), q = clamp(x / scale, +-448) cast to e4m3
with round-to-nearest-even; tests compare the two (tests/unit/test_fp8_rows.py under
Triton's interpreter, tests/gpu/test_fp8_cuda.py on CUDA). Written here, not taken from a
package, for the reason fp8.py gives: it is one small kernel.
"""

from __future__ import annotations

import logging

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # fp8.py keeps its PyTorch path
    triton = None

log = logging.getLogger("omni.engines.quantization")
FP8_MAX = 448.0
MAX_BLOCK = 4096  # row elements per loop iteration (wider rows loop)


_disabled: str | None = None  # why the kernel is off in this process (it failed once)


def disable_fused(exc: Exception) -> None:
    """The kernel failed (e.g. a Triton that cannot build it): the PyTorch form from now on,
    said once."""
    global _disabled
    if _disabled is None:
        _disabled = f"{type(exc).__name__}: {exc}"
        log.warning("fp8 activations: the fused Triton kernel failed (%s); using the "
                    "PyTorch form (six kernels a linear, slower) from now on", _disabled)


def fused_available(x: torch.Tensor) -> bool:
    """The kernel serves x: triton present, x on CUDA, and not inside torch.compile, whose
    own fusion of the PyTorch path is as good and which would have to trace the launch.
    (Triton's CPU interpreter runs it in tests only: its fp8 cast drops the carry of a
    rounding into the next power of two, e.g. 124.95 -> 64 instead of 128.)"""
    return (triton is not None and _disabled is None and x.is_cuda
            and not torch.compiler.is_compiling())


if triton is not None:

    @triton.jit
    def _quantize_rows_kernel(x_ptr, q_ptr, scale_ptr, width, x_stride,
                              BLOCK: tl.constexpr, LIMIT: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offsets = tl.arange(0, BLOCK)
        x_row = x_ptr + row * x_stride
        q_row = q_ptr + row * width
        peak = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, width, BLOCK):
            mask = start + offsets < width
            x = tl.load(x_row + start + offsets, mask=mask, other=0.0).to(tl.float32)
            peak = tl.maximum(peak, tl.abs(x))
        scale = tl.maximum(tl.max(peak, axis=0), 1e-12) / LIMIT
        tl.store(scale_ptr + row, scale)
        for start in range(0, width, BLOCK):
            mask = start + offsets < width
            x = tl.load(x_row + start + offsets, mask=mask, other=0.0).to(tl.float32)
            # div_rn: IEEE division, as PyTorch's; Triton's `/` is the approximate one (2 ulp),
            # which moved values across fp8 rounding boundaries (tests/gpu found them)
            q = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -LIMIT), LIMIT)
            q = q.to(q_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
            tl.store(q_row + start + offsets, q, mask=mask)


def quantize_rows_fused(rows: torch.Tensor, fp8_dtype: torch.dtype
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """rows (M, K), unit stride along K -> (q (M, K) fp8, scale (M, 1) float32)."""
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    count, width = rows.shape
    q = torch.empty((count, width), dtype=fp8_dtype, device=rows.device)
    scale = torch.empty((count, 1), dtype=torch.float32, device=rows.device)
    if count:
        block = min(MAX_BLOCK, triton.next_power_of_2(width))
        _quantize_rows_kernel[(count,)](rows, q, scale, width, rows.stride(0),
                                        BLOCK=block, LIMIT=FP8_MAX,
                                        num_warps=8 if block >= 2048 else 4)
    return q, scale
