"""Prefill attention: the engine's paged SDPA paths against flash attention's varlen kernel.

`python bench/probes/varlen_prefill.py [OUT_JSON]` (CUDA, bf16): one attention layer of the
Qwen3-8B shape (32 query heads, 8 KV heads, head dim 128) over a paged KV cache of 16-token
blocks in shuffled order, for the step shapes issue #44 names: 8 fresh 2,048-token prompts,
1 fresh 8,192-token prompt, 4 chunks of 1,024 after a cached 1,024-token prefix (the
masked path), and one 2,048-token chunk beside 7 decode rows. Per shape:
- ours: omni/engines/ar/paged_attention.py's function as the model calls it (cache write +
  attention; it picks padded, per-sequence or masked SDPA by itself);
- varlen: the same cache write, then the step's context rows gathered once into packed
  K/V and ONE torch.nn.attention.varlen.varlen_attn call (flash attention, causal
  bottom-right aligned, grouped heads as they are);
- varlen_paged: varlen_attn reading the cache in place through its block table, if this
  torch accepts 16-token pages (it says why not otherwise).
Each is checked against ours (max abs error) and timed with CUDA events (median of 20
after 3 warm-ups). Prints the torch version and varlen_attn's signature first, since the
GPU box's torch is older than the VM's.
"""

from __future__ import annotations

import inspect
import json
import random
import sys

import torch

from omni.engines.ar.kv_cache import PagedKVCache
from omni.engines.ar.paged_attention import build_layout, paged_attention

HEADS, KV_HEADS, DIM, BLOCK = 32, 8, 128, 16
SHAPES = {  # name -> [(cached prefix, new tokens)] per sequence
    "8x2048 fresh": [(0, 2048)] * 8,
    "1x8192 fresh": [(0, 8192)],
    "4x1024 after 1024 cached": [(1024, 1024)] * 4,
    "2048 chunk + 7 decodes": [(0, 2048)] + [(1500, 1)] * 7,
}


class Layer(torch.nn.Module):
    """What paged_attention reads of the model's attention module: its cache buffers."""

    def __init__(self, cache: PagedKVCache) -> None:
        super().__init__()
        self.omni_k_cache, self.omni_v_cache = cache.k[0], cache.v[0]


def _timed(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _varlen_kwargs(fn) -> dict:
    """Causal + grouped heads, in whichever spelling this torch's varlen_attn has."""
    params = inspect.signature(fn).parameters
    kwargs = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    if "enable_gqa" in params:
        kwargs["enable_gqa"] = True
    return kwargs


def _shape(name: str, seqs: list[tuple[int, int]], cache: PagedKVCache, layer: Layer,
           rng: random.Random) -> dict:
    from torch.nn.attention.varlen import varlen_attn

    free = list(range(cache.pool.num_blocks))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(-(-(p + n) // BLOCK))] for p, n in seqs]
    starts, lens = [p for p, _ in seqs], [n for _, n in seqs]
    total = sum(lens)
    q = torch.randn(1, HEADS, total, DIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, KV_HEADS, total, DIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    layout = build_layout(cache, tables, starts, lens, torch.device("cuda"))
    ours = lambda: paged_attention(layer, q, k, v, None, DIM ** -0.5, omni_batch=layout)[0]  # noqa: E731
    # packed context slots of every sequence, and the cumulative lengths varlen reads
    slots = torch.cat([
        (torch.tensor(t)[torch.arange(p + n) // BLOCK] * BLOCK + torch.arange(p + n) % BLOCK)
        for t, (p, n) in zip(tables, seqs, strict=True)]).cuda()
    cu_q = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda",
                        dtype=torch.int32)
    ctx = [p + n for p, n in seqs]
    cu_k = torch.tensor([0, *torch.tensor(ctx).cumsum(0).tolist()], device="cuda",
                        dtype=torch.int32)
    kwargs = _varlen_kwargs(varlen_attn)
    packed_q = q[0].transpose(0, 1)  # (N, H, D)

    def varlen():
        layer.omni_k_cache.index_copy_(0, layout.write_slots, k[0].transpose(0, 1))
        layer.omni_v_cache.index_copy_(0, layout.write_slots, v[0].transpose(0, 1))
        return varlen_attn(packed_q, layer.omni_k_cache[slots], layer.omni_v_cache[slots],
                           cu_q, cu_k, max(lens), max(ctx), scale=DIM ** -0.5, **kwargs)

    ref = ours()
    row = {"shape": name, "tokens": total, "ours_ms": _timed(ours)}
    try:
        got = varlen()
        row["varlen_err"] = float((got.float() - ref.float()).abs().max())
        row["varlen_ms"] = _timed(varlen)
    except Exception as e:  # noqa: BLE001 - a probe: say what this torch refuses
        row["varlen_error"] = f"{type(e).__name__}: {e}"[:300]
    row.update(_paged(varlen_attn, kwargs, packed_q, layer, tables, ctx, cu_q, lens, ref))
    print(f"[varlen] {json.dumps(row)}", flush=True)
    return row


def _paged(varlen_attn, kwargs, packed_q, layer, tables, ctx, cu_q, lens, ref) -> dict:
    if "block_table" not in inspect.signature(varlen_attn).parameters:
        return {"paged_error": "this torch's varlen_attn has no block_table"}
    width = max(len(t) for t in tables)
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], device="cuda",
                         dtype=torch.int32)
    used = torch.tensor(ctx, device="cuda", dtype=torch.int32)
    pages_k = layer.omni_k_cache.view(-1, BLOCK, KV_HEADS, DIM)
    pages_v = layer.omni_v_cache.view(-1, BLOCK, KV_HEADS, DIM)

    def paged():
        return varlen_attn(packed_q, pages_k, pages_v, cu_q, None, max(lens), max(ctx),
                           scale=DIM ** -0.5, seqused_k=used, block_table=table, **kwargs)
    try:
        got = paged()
        return {"paged_err": float((got.float() - ref.float()).abs().max()),
                "paged_ms": _timed(paged)}
    except Exception as e:  # noqa: BLE001
        return {"paged_error": f"{type(e).__name__}: {e}"[:300]}


def main() -> None:
    from torch.nn.attention import varlen

    print(f"[varlen] torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"[varlen] varlen_attn{inspect.signature(varlen.varlen_attn)}")
    blocks = sum(-(-(p + n) // BLOCK) for seqs in SHAPES.values() for p, n in seqs) + 8
    cache = PagedKVCache(1, KV_HEADS, DIM, blocks, BLOCK, torch.bfloat16,
                         torch.device("cuda"), "triton")
    cache.k[0].normal_()
    cache.v[0].normal_()
    layer = Layer(cache)
    rng = random.Random(0)
    rows = [_shape(name, seqs, cache, layer, rng) for name, seqs in SHAPES.items()]
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(),
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
