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
