"""A prefill step's attention as ONE flash-attention call over the packed sequences (CUDA).

torch's ``varlen_attn`` (torch.nn.attention.varlen, flash attention) takes the step's
queries packed end to end, ``(N, H, D)``, and each sequence's context packed the same way,
with cumulative lengths saying where each sequence starts; causal masking is aligned to
the bottom right, so a chunk after a cached prefix attends to the prefix and causally to
itself, and a decode row (one query) to its whole context. Grouped KV heads are read as
they are (a newer torch wants ``enable_gqa`` for that, and refuses them without it). That
replaces paged_attention.py's SDPA paths for prefill steps on CUDA: padded batches (work
up to doubled), one call per sequence (host time per sequence and layer),
and the masked memory-efficient kernel a cached prefix needed. On an H200 (one layer of the
8B shape, bf16; bench/probes/varlen_prefill.py) it took 1.14 ms for 8 fresh 2,048-token
prompts against 2.11 ms, 0.54 against 1.84 ms for 4 chunks after a cached prefix, 0.41
against 2.50 ms for a 2,048-token chunk beside 7 decode rows.

The context rows are gathered from the paged cache once per layer (the GPU box's torch
2.11 has no block-table form of varlen_attn); a step whose sequences all start at position
0 needs no gather: its new keys are its whole context.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch

FLASH_DTYPES = (torch.bfloat16, torch.float16)


@dataclass
class VarlenPrefill:
    """Where one step's sequences lie in the packed queries and in the packed contexts."""

    cu_q: torch.Tensor  # (B + 1,) int32: cumulative query lengths
    cu_k: torch.Tensor  # (B + 1,) int32: cumulative context lengths
    max_q: int
    max_k: int
    context_slots: torch.Tensor | None  # (sum of contexts,) cache slots; None: all fresh


@cache
def _kernel_kwargs() -> dict | None:
    """varlen_attn's causal switch in this torch's spelling, and its grouped-KV switch
    where it has one (without it, a newer torch raises for fewer KV heads than query
    heads: every grouped-query model); None when it has no causal switch."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    gqa = {"enable_gqa": True} if "enable_gqa" in params else {}
    if "window_size" in params:
        return {"window_size": (-1, 0), **gqa}
    return {"is_causal": True, **gqa} if "is_causal" in params else None


def usable(device: torch.device, dtype: torch.dtype) -> bool:
    """Flash attention's varlen kernel runs here: CUDA, half precision, a torch that has it."""
    return device.type == "cuda" and dtype in FLASH_DTYPES and _kernel_kwargs() is not None


def varlen_layout(tables: list[list[int]], starts: list[int], query_lens: list[int],
                  block_size: int, device: torch.device) -> tuple[torch.Tensor, VarlenPrefill]:
    """The cache slots the step's new tokens write, and its VarlenPrefill."""
    lens = [s + n for s, n in zip(starts, query_lens, strict=True)]
    slots = []
    for table, length in zip(tables, lens, strict=True):
        positions = np.arange(length)
        slots.append(np.asarray(table, dtype=np.int64)[positions // block_size] * block_size
                     + positions % block_size)
    write = np.concatenate([s[start:] for s, start in zip(slots, starts, strict=True)])
    fresh = not any(starts)
    cu = np.zeros((2, len(lens) + 1), dtype=np.int32)
    cu[0, 1:], cu[1, 1:] = np.cumsum(query_lens), np.cumsum(lens)
    cu_t = torch.from_numpy(cu).to(device)
    context = None if fresh else torch.from_numpy(np.concatenate(slots)).to(device)
    return torch.from_numpy(write).to(device), VarlenPrefill(
        cu_t[0], cu_t[1], max(query_lens), max(lens), context)


def varlen_attention(q: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     k_cache: torch.Tensor, v_cache: torch.Tensor, step: VarlenPrefill,
                     scale: float | None, window: int | None) -> torch.Tensor:
    """q (H, N, D); key/value (KVH, N, D), the step's new rows (already in the cache);
    returns (N, H, D)."""
    from torch.nn.attention.varlen import varlen_attn

    kwargs = dict(_kernel_kwargs())
    if window:
        if "window_size" not in kwargs:
            raise RuntimeError("this torch's varlen_attn has no sliding window")
        kwargs["window_size"] = (window - 1, 0)  # keys at positions > query - window
    if step.context_slots is None:  # every sequence is new: its keys are the new rows
        k, v = key.transpose(0, 1), value.transpose(0, 1)
    else:
        k, v = k_cache[step.context_slots], v_cache[step.context_slots]
    return varlen_attn(q.transpose(0, 1), k.to(q.dtype), v.to(q.dtype), step.cu_q, step.cu_k,
                       step.max_q, step.max_k, scale=scale, **kwargs)
