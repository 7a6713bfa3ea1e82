"""An AR stage's memory budget on a GPU: the KV cache gets what the weights, the decode
graphs and the largest step's activations leave.

A stage's `memory:` used to buy weights + KV cache only. The decode graphs' private pool
(their activations and every graph's own output buffers) and the peak of an eager prefill
step of max_batched_tokens came on top, unmeasured: an omni model's thinker stage held
41.8 GiB against a 36 GiB budget on the H200. Both depend on the model, max_num_seqs, the graph
buckets and max_batched_tokens, not on the KV cache's size, so they are measured first,
on a probe cache just large enough for the warm-up steps:

    empty the allocator's cache; base = reserved (weights + probe cache)
    capture every decode graph, run the warm-up prefill steps (warm.py)
    runtime = peak reserved - base   (graphs' pool held + the prefill step's peak)

then the probe is dropped (graphs, pool, cache) and the real KV cache is sized from
budget - weights - runtime, and the graphs are captured again over it (torch.compile's
code is reused: the second capture costs the replays, not the compile). Reserved, not
allocated, bytes: that is what the process takes from the device (omni/engines/generation/
memory.py says why). On CPU there is nothing to measure: the budget buys weights + KV.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

import torch

from omni.engines.ar.kv_cache import sized_cache
from omni.engines.ar.warm import BATCH_SEQUENCES, SHORT_PROMPT

log = logging.getLogger("omni.engines.ar.budget")


def probe_blocks(block_size: int, max_batched_tokens: int) -> int:
    """KV blocks the warm-up steps borrow (one at a time) plus the graphs' scratch block."""
    share = -(-max(1, max_batched_tokens // BATCH_SEQUENCES) // block_size)
    return max(BATCH_SEQUENCES * share, -(-SHORT_PROMPT // block_size)) + 1


def measure_runtime_bytes(engine: Any, batched: int) -> int:
    """Bytes the engine's graphs and warm-up prefill take beyond weights + KV cache,
    measured on a probe cache (engine.serve_on builds graphs and warms over a cache;
    engine.drop_runtime lets go of them)."""
    device = engine.lm.device
    blocks = probe_blocks(int(engine.options.get("block_size", 16)), batched)
    options = {**engine.options, "kv_cache_blocks": blocks}
    probe = sized_cache(engine.lm, options, None,
                        lambda name, d: blocks if name == "kv_cache_blocks" else engine._opt(name, d))
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved(device)
    torch.cuda.reset_peak_memory_stats(device)
    engine.serve_on(probe)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_reserved(device) - base
    graphs = engine.graphs.pool_bytes if engine.graphs is not None else 0
    engine.drop_runtime()
    del probe
    gc.collect()
    torch.cuda.empty_cache()
    log.info("decode graphs hold %.0f MiB; with the largest warm-up prefill step the stage "
             "needs %.0f MiB beside its weights and KV cache (counted in its memory budget)",
             graphs / 2**20, peak / 2**20)
    return max(peak, graphs)


def kv_capacity(cache: Any, max_context: int | None) -> dict[str, int]:
    """READY's account of the KV cache: the tokens it holds and, when the model has a
    context limit, how many sequences of that full length fit at once."""
    capacity = {"kv_tokens": cache.pool.num_blocks * cache.block_size}
    if max_context:
        capacity["max_context"] = max_context
        capacity["full_context_sequences"] = cache.pool.num_blocks // cache.blocks_for(max_context)
    return capacity


def capacity_warning(info: dict[str, Any], budget: int | None) -> str | None:
    """Say so when a stage's memory budget leaves room for fewer full-length sequences than
    max_num_seqs, naming the budget that would fit them all and the other ways out. Without
    a budget (a CPU's default cache, kv_cache_mb, kv_cache_blocks) the READY line still says
    how many fit; the operator chose that size."""
    fits, seqs = info.get("full_context_sequences"), info.get("max_num_seqs")
    if budget is None or fits is None or not seqs or fits >= seqs:
        return None
    context, block = info["max_context"], info["block_size"]
    need = seqs * -(-context // block) * info["kv_block_bytes"]
    have = info["kv_blocks"] * info["kv_block_bytes"]
    gib = 2 ** 30
    return (f"its KV cache ({have / gib:.2f} GiB, {info['kv_tokens']} tokens) holds "
            f"{fits} sequences of the full {context}-token context, fewer than max_num_seqs "
            f"{seqs}: beyond that, long requests wait for room or are preempted. To fit them "
            f"all, raise the stage's memory by {(need - have) / gib:.2f} GiB (to about "
            f"{(budget + need - have) / gib:.1f} GiB), or lower option max_model_len "
            f"(~{info['kv_tokens'] // seqs} tokens would fit) or max_num_seqs")
