"""The fused fp8 activation quantization kernel (omni/engines/quantization/fp8_rows.py)
against fp8.py's PyTorch form, on the CPU under Triton's interpreter. Its scales must be
equal; its fp8 values too, except where the interpreter's own fp8 cast loses the carry of
a rounding into the next power of two (it halves that value: 124.95 gives 64, not 128).
That exception is checked to be exactly that, so any other difference fails. Bitwise
equality on CUDA: tests/gpu/test_fp8_cuda.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

CHECK = """
import torch
from omni.engines.quantization import fp8, fp8_rows
torch.manual_seed(0)
cases = [((5, 48), torch.bfloat16), ((3, 5000), torch.float32), ((7, 64), torch.float16),
         ((0, 32), torch.bfloat16)]
for shape, dtype in cases:
    # rows from 1e-3 to 1e3 in size, and one all-zero row (its scale is the 1e-12 floor)
    x = (torch.randn(shape) * torch.logspace(-3, 3, max(shape[0], 1))[:shape[0], None])
    x = x.to(dtype)
    if shape[0]:
        x[0] = 0
    q, scale = fp8_rows.quantize_rows_fused(x, fp8.FP8)
    assert not fp8_rows.fused_available(x)  # never used to serve on a CPU
    ref_scale = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / fp8.FP8_MAX
    ref = (x.float() / ref_scale).clamp(-fp8.FP8_MAX, fp8.FP8_MAX).to(fp8.FP8).float()
    got = q.float()
    assert q.dtype == fp8.FP8 and q.shape == x.shape and scale.shape == (shape[0], 1)
    assert torch.equal(scale, ref_scale), (shape, dtype)
    differ = got != ref
    powers = torch.log2(ref.abs().clamp(min=1e-30)).frac() == 0
    assert torch.equal(got[differ] * 2, ref[differ]) and powers[differ].all(), (shape, dtype)
    assert differ.sum() <= 0.05 * differ.numel(), (shape, dtype)
    if shape[0]:
        assert ref[1:].abs().amax(dim=1).eq(fp8.FP8_MAX).all()  # every row uses the range
print("ok")
"""


def test_the_kernel_equals_the_pytorch_form_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(CHECK)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_a_kernel_that_fails_leaves_the_pytorch_form(monkeypatch, caplog):
    import torch

    from omni.engines.quantization import fp8, fp8_rows

    calls = []

    def broken(rows, dtype):
        calls.append(rows.shape)
        raise RuntimeError("cannot build")
    monkeypatch.setattr(fp8_rows, "_disabled", None)
    monkeypatch.setattr(fp8, "quantize_rows_fused", broken)
    monkeypatch.setattr(fp8, "fused_available", lambda x: fp8_rows.fused_available(x)
                        or (fp8_rows._disabled is None))  # as on CUDA, until it failed
    x = torch.randn(4, 32)
    with caplog.at_level("WARNING", logger="omni.engines.quantization"):
        q, scale = fp8.quantize_activations(x)
        fp8.quantize_activations(x)
    want = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / fp8.FP8_MAX
    assert torch.equal(scale, want) and q.dtype == fp8.FP8
    assert len(calls) == 1 and caplog.text.count("cannot build") == 1  # tried once, said once
    assert fp8_rows._disabled == "RuntimeError: cannot build"
