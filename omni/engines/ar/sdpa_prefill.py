"""Prefill attention through SDPA over gathered paged contexts (paged_attention.py's paths
where flash attention's varlen kernel does not run: CPU, float32, or prefill_attention: sdpa)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# CUDA prefill attention without cuDNN's backend: it builds an execution plan for every
# new shape, and a prefill step's shapes are new all the time (query and context lengths
# of whichever prompts share the step). On an H200 (8B dense shape, torch 2.11) a step
# of 2 new prompts beside 6 decoding sequences took 709 ms, 585 ms of it inside
# _cudnn_attention_forward, against 80 ms once its plans existed (bench/probes/
# mixed_step.py); those stalls were the TTFT outliers at concurrency 8.
# Prompts with no cached prefix need no mask at all (causal from position 0): flash
# attention runs them, faster than any masked kernel (masked, the 8B shape's c=1 TTFT of a
# 128-token prompt was 59 ms against 39 ms with cuDNN).
PREFILL_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def _same_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """k, v with their grouped KV heads repeated to the query's heads: the flash and
    memory-efficient kernels do not all take grouped heads, and SDPA would fall back to
    its math path, whose scores for an 8192-token prompt are gigabytes."""
    if k.shape[1] == q.shape[1]:
        return k, v
    groups = q.shape[1] // k.shape[1]
    return k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     scale: float | None) -> torch.Tensor:
    """CUDA SDPA of q (B, H, L, D) over k, v (B, KVH, L, D), causal from position 0."""
    k, v = _same_heads(q, k, v)
    with sdpa_kernel(PREFILL_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     scale: float | None) -> torch.Tensor:
    """SDPA of q (B, H, Lq, D) over k, v (B, KVH, Lk, D) with a bool mask. On CUDA the
    memory-efficient kernel takes the mask; on CPU SDPA picks as it likes."""
    if not q.is_cuda:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                              enable_gqa=k.shape[1] != q.shape[1])
    k, v = _same_heads(q, k, v)
    with sdpa_kernel(PREFILL_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
