"""The varlen prefill kernel's call (omni/engines/ar/varlen_prefill.py) passes torch's own
checks for grouped KV heads (fewer KV heads than query heads: Qwen3, Llama, ...). torch
>= 2.12 refuses them unless asked with ``enable_gqa``, in Python, before the kernel runs;
so on CPU, where flash attention's kernel does not exist, the call must get as far as the
kernel (tests/gpu/test_varlen_prefill_cuda.py compares its output on CUDA)."""

from __future__ import annotations

import pytest
import torch

from omni.engines.ar.varlen_prefill import VarlenPrefill, varlen_attention

HEADS, KV_HEADS, DIM, TOKENS = 8, 2, 64, 10


@pytest.mark.parametrize("window", [None, 4])
def test_grouped_kv_heads_get_past_torchs_head_check(window):
    pytest.importorskip("torch.nn.attention.varlen")
    q = torch.randn(HEADS, TOKENS, DIM, dtype=torch.bfloat16)
    key, value = (torch.randn(KV_HEADS, TOKENS, DIM, dtype=torch.bfloat16) for _ in range(2))
    cu = torch.tensor([0, 4, TOKENS], dtype=torch.int32)
    step = VarlenPrefill(cu, cu, 6, 6, None)  # two fresh prompts: no cache gather
    with pytest.raises(NotImplementedError, match="CPU"):  # the kernel, not the head check
        varlen_attention(q, key, value, None, None, step, DIM ** -0.5, window)
