"""Eager prefill steps at load, so that the first requests do not pay first-use costs.

The first eager forward of a process pays one-time costs: kernels loaded on first use
(CUDA's lazy module loading), cuBLAS handles and workspaces, the caching allocator's
first segments. On an H200 the first 128-token prefill of an 8B dense model took 1.4 s,
against 44-53 ms after it, and the first batch of 32 prompts 231 ms against 147 ms
(bench/results/ar-h200.md, "TTFT of short prompts"): without a warm-up the first
requests after a start wait for that. Decode steps are warmed by their graph captures (decode_graphs.py);
this does the same for prefill with two forwards of zero inputs: one short prompt (the
one-sequence attention path) and one full step of max_batched_tokens over four sequences
(the padded-batch path, at the step's peak activation memory, so a budget too tight for
it fails at load, not under load). Their KV blocks are borrowed from the pool and given
back; nothing is published for prefix caching and nothing enters the scheduler.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from omni.engines.ar.kv_cache import PagedKVCache
from omni.engines.ar.paged_attention import build_layout
from omni.engines.base import EngineLoadError

log = logging.getLogger("omni.engines.ar.warm")

SHORT_PROMPT = 16  # tokens of the one-sequence warm-up step
BATCH_SEQUENCES = 4  # sequences sharing the full warm-up step


def warm_prefill(lm: Any, cache: PagedKVCache, max_batched_tokens: int,
                 inputs: Callable[[int], dict[str, torch.Tensor]]) -> list[int]:
    """Run the warm-up steps and log them; a step that does not fit beside the KV cache
    is a load error that says which setting to lower."""
    started = time.perf_counter()
    try:
        ran = warm_steps(lm, cache, max_batched_tokens, inputs)
    except torch.cuda.OutOfMemoryError as e:  # what the first big step would hit
        raise EngineLoadError(
            f"a prefill step of max_batched_tokens={max_batched_tokens} does not fit beside "
            f"the KV cache: lower max_batched_tokens or the KV cache (kv_cache_mb, or the "
            f"stage's memory budget): {e}") from e
    log.info("warmed prefill steps of %s tokens in %.1f s", ran, time.perf_counter() - started)
    return ran


def warm_steps(lm: Any, cache: PagedKVCache, max_batched_tokens: int,
               inputs: Callable[[int], dict[str, torch.Tensor]]) -> list[int]:
    """Run the warm-up steps; returns the tokens of each step that ran (a step whose
    blocks the pool cannot lend is skipped). inputs(n): the model's inputs for n tokens
    (input_ids, or inputs_embeds for a model fed embeddings)."""
    share = max(1, max_batched_tokens // BATCH_SEQUENCES)
    ran = []
    for lengths in ([min(SHORT_PROMPT, max_batched_tokens)], [share] * BATCH_SEQUENCES):
        tables = borrow_blocks(cache, lengths)
        if tables is None:
            continue
        try:
            prefill_forward(lm, cache, tables, lengths, inputs)
        finally:
            give_back(cache, tables)
        ran.append(sum(lengths))
    if lm.device.type == "cuda":
        torch.cuda.synchronize(lm.device)
    return ran


def borrow_blocks(cache: PagedKVCache, lengths: list[int]) -> list[list[int]] | None:
    """KV blocks for sequences of `lengths` tokens, lent by the pool (None: not enough)."""
    if sum(cache.blocks_for(n) for n in lengths) > cache.pool.available:
        return None
    return [[cache.pool.allocate() for _ in range(cache.blocks_for(n))] for n in lengths]


def give_back(cache: PagedKVCache, tables: list[list[int]]) -> None:
    for table in tables:
        for block in table:
            cache.pool.release(block)


@torch.inference_mode()
def prefill_forward(lm: Any, cache: PagedKVCache, tables: list[list[int]], lengths: list[int],
             inputs: Callable[[int], dict[str, torch.Tensor]]) -> None:
    device = lm.device
    layout = build_layout(cache, tables, [0] * len(lengths), lengths, device)
    positions = torch.cat([torch.arange(n) for n in lengths]).to(device)[None]
    last = torch.tensor(lengths).cumsum(0) - 1
    keep = {"logits_to_keep": last.to(device)} if lm.keeps_logits else {}
    lm.model(**inputs(sum(lengths)), position_ids=positions, use_cache=False,
             omni_batch=layout, **keep)
