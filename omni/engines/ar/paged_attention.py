"""Attention over the paged KV cache, plugged into transformers model definitions.

The engine runs a step as ONE forward call over a packed batch: the new tokens of every
scheduled sequence (a whole prompt chunk for a prefill, one token for a decode) are laid
end to end as a batch of one, ``(1, N)``, with each token's own position id. The model
computes Q/K/V and rotary embeddings as it always does and then calls the attention
function registered here (``ATTN_NAME``, through transformers' AttentionInterface), which

1. writes the new tokens' K and V into their cache slots, and
2. attends each sequence's queries over that sequence's cached context only (causal,
   and windowed for sliding-window layers).

transformers builds no mask for an attention name it has no mask function for, so the
packed batch costs nothing extra there. The batch layout travels to this function as
the ``omni_batch`` keyword argument of the model call (transformers passes unknown
keyword arguments down to the attention function).

Kernels: a decode-only step (every sequence adds one token) runs the Triton kernel of
``paged_decode_kernel`` where the cache says so (CUDA by default), or on CPU the C++ one
of ``cpu_decode_kernel`` (when it builds), both reading the cached rows in place;
otherwise it gathers the contexts into one padded tensor and makes one
``scaled_dot_product_attention`` call. A step with prefills makes one flash-attention call
over the packed sequences where the cache says so (varlen_prefill.py; CUDA, half precision
by default); else (CPU) it pads its sequences' queries and contexts into one SDPA call per
layer when padding at most doubles the work, or makes one SDPA call per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from omni.engines.ar import cpu_decode_kernel
from omni.engines.ar.kv_cache import PagedKVCache
from omni.engines.ar.sdpa_prefill import causal_attention, masked_attention
from omni.engines.ar.varlen_prefill import VarlenPrefill, varlen_attention, varlen_layout

ATTN_NAME = "omni_paged"


@dataclass
class PaddedPrefill:
    """Some of a step's sequences as one padded batch of queries (B, Lq) over contexts
    (B, Lk); a step's padded prefill is one or two of these (_padded_layout)."""

    rows: torch.Tensor  # (B, Lq) packed row of each query; padding repeats the last row
    valid: torch.Tensor  # (B, Lq) bool: a real query (its output is kept)
    query_pos: torch.Tensor  # (B, Lq, 1) position of each query
    key_pos: torch.Tensor  # (Lk,)
    mask: torch.Tensor  # (B, 1, Lq, Lk) bool: causal and within the context
    slots: torch.Tensor  # (B, Lk) cache slot of each context position
    # every sequence starts at position 0 (no cached prefix, no decode row): plain causal
    # attention is exact for the real queries (Lq == Lk; padded keys lie after them)
    fresh: bool = False


@dataclass
class BatchLayout:
    """Where the packed tokens of one step go, and what each sequence attends to."""

    cache: PagedKVCache
    write_slots: torch.Tensor  # (N,) cache slot of every packed token
    query_lens: list[int]  # new tokens per sequence, in packing order
    context_lens: list[int]  # cached + new tokens per sequence
    context_slots: list[torch.Tensor]  # per sequence: (context_len,) slots, in order
    decode_only: bool  # every query_len is 1
    padded_slots: torch.Tensor | None = None  # decode: (B, Lmax) slots
    padded_valid: torch.Tensor | None = None  # decode: (B, Lmax) bool
    prefill: list[PaddedPrefill] | None = None  # a prefill step batched by padding
    context_len_t: torch.Tensor | None = None  # decode: (B,) context lengths on the device
    varlen: VarlenPrefill | None = None  # a prefill step as one flash-attention call


def bind_cache(model: torch.nn.Module, cache: PagedKVCache) -> list[torch.nn.Module]:
    """Give every attention module that runs this file's attention its layer's cache
    tensors (non-persistent buffers; the same storage, no copy); returns the decoder
    layers that hold them, the repeated blocks a decode step runs.

    Why buffers, not ``cache.k[module.layer_idx]``: a compiled layer then reads no
    per-layer integer, so torch.compile traces ONE decoder layer and reuses it for every
    layer (each layer's buffers are inputs of the same graph). Indexing by layer_idx
    made dynamo specialise on it: a compile per layer, or one graph the size of the
    whole model, which took minutes to compile for a 36-layer model."""
    for module in model.modules():
        if _runs_paged(module):
            module.register_buffer("omni_k_cache", cache.k[module.layer_idx], persistent=False)
            module.register_buffer("omni_v_cache", cache.v[module.layer_idx], persistent=False)
    return paged_layers(model)


def _runs_paged(module: torch.nn.Module) -> bool:
    config = getattr(module, "config", None)
    return (isinstance(getattr(module, "layer_idx", None), int)
            and getattr(config, "_attn_implementation", None) == ATTN_NAME)


def paged_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers whose attention runs this file's function (not a vision or audio
    tower's): the repeated blocks a decode step runs."""
    bound = {id(m) for m in model.modules() if _runs_paged(m)}
    if not bound:
        raise RuntimeError(f"no attention module of the model uses '{ATTN_NAME}'")
    return [block for stack in model.modules() if isinstance(stack, torch.nn.ModuleList)
            for block in stack if any(id(m) in bound for m in block.modules())]


def build_layout(cache: PagedKVCache, tables: list[list[int]], starts: list[int],
                 query_lens: list[int], device: torch.device) -> BatchLayout:
    """Layout for sequences whose new tokens sit at positions [start, start + n)."""
    lens = [s + n for s, n in zip(starts, query_lens, strict=True)]
    if all(n == 1 for n in query_lens):
        return _decode_layout(cache, tables, lens, device)
    if cache.prefill_kernel == "varlen":
        write, step = varlen_layout(tables, starts, query_lens, cache.block_size, device)
        return BatchLayout(cache, write, list(query_lens), lens, [], False, varlen=step)
    if _pads_cheaply(query_lens, lens):
        return _padded_layout(cache, tables, starts, query_lens, lens, device)
    bs = cache.block_size
    context_slots, write = [], []
    for table, start, length in zip(tables, starts, lens, strict=True):
        positions = torch.arange(length)
        slots = torch.tensor(table, dtype=torch.long)[positions // bs] * bs + positions % bs
        context_slots.append(slots.to(device))
        write.append(slots[start:])
    return BatchLayout(cache, torch.cat(write).to(device), list(query_lens), lens,
                       context_slots, False)


# the most query x key pairs of a padded prefill call: SDPA with a mask may take its math
# path, whose scores are pairs x heads floats (2**23 pairs x 32 heads: 1 GiB). Long prompts
# are compute-bound anyway; padding is for many short ones (32 x 128 tokens: 2**19 pairs).
PAD_PAIRS_LIMIT = 1 << 23


def _pads_cheaply(query_lens: list[int], lens: list[int]) -> bool:
    """Padding every sequence to the longest query and context at most doubles the
    attention's work (query x key pairs), within PAD_PAIRS_LIMIT."""
    exact = sum(n * length for n, length in zip(query_lens, lens, strict=True))
    padded = len(lens) * max(query_lens) * max(lens)
    return len(lens) > 1 and padded <= 2 * exact and padded <= PAD_PAIRS_LIMIT


def _padded_layout(cache: PagedKVCache, tables: list[list[int]], starts: list[int],
                   query_lens: list[int], lens: list[int], device: torch.device) -> BatchLayout:
    """A prefill step as padded batches (PaddedPrefill): the sequences that start at
    position 0 in one (causal attention needs no mask for them: paged_attention), the
    others (decode rows, prompts after a cached prefix) in another, so one decode row
    beside 31 new prompts does not send them all down the masked path. A padding query
    repeats its sequence's last query (same position, so it sees real keys only; its
    output is dropped), which keeps every row of the mask non-empty."""
    n_all = torch.tensor(query_lens, dtype=torch.long)
    offsets = (torch.cumsum(n_all, 0) - n_all).tolist()
    write = torch.empty(sum(query_lens), dtype=torch.long)
    groups = []
    for fresh in (True, False):
        members = [i for i, start in enumerate(starts) if (start == 0) == fresh]
        if members:
            group, group_write = _padded_group(cache, [tables[i] for i in members],
                                               [starts[i] for i in members],
                                               [query_lens[i] for i in members],
                                               [lens[i] for i in members],
                                               [offsets[i] for i in members], fresh)
            write[group.rows[group.valid]] = group_write
            groups.append(group)
    return BatchLayout(cache, write.to(device), list(query_lens), lens, [], False,
                       prefill=[_to_device(g, device) for g in groups])


def _padded_group(cache: PagedKVCache, tables: list[list[int]], starts: list[int],
                  query_lens: list[int], lens: list[int], offsets: list[int], fresh: bool
                  ) -> tuple[PaddedPrefill, torch.Tensor]:
    """One padded batch (on the host) and the cache slots its real queries write."""
    slots, key_valid = padded_context_slots(tables, lens, cache.block_size, max(lens))
    n = torch.tensor(query_lens, dtype=torch.long).unsqueeze(1)
    step = torch.minimum(torch.arange(max(query_lens)).unsqueeze(0), n - 1)  # (B, Lq)
    valid = torch.arange(max(query_lens)).unsqueeze(0) < n
    query_pos = torch.tensor(starts, dtype=torch.long).unsqueeze(1) + step
    rows = torch.tensor(offsets, dtype=torch.long).unsqueeze(1) + step
    key_pos = torch.arange(max(lens))
    mask = (key_pos <= query_pos.unsqueeze(2)) & key_valid.unsqueeze(1)
    write = torch.gather(slots, 1, query_pos)[valid]  # sequence, then position
    return PaddedPrefill(rows, valid, query_pos.unsqueeze(2), key_pos, mask.unsqueeze(1),
                         slots, fresh), write


def _to_device(group: PaddedPrefill, device: torch.device) -> PaddedPrefill:
    return PaddedPrefill(*(t.to(device) for t in (group.rows, group.valid, group.query_pos,
                                                   group.key_pos, group.mask, group.slots)),
                         fresh=group.fresh)


def block_table(tables: list[list[int]], blocks: int, pad_block: int = 0) -> torch.Tensor:
    """(B, blocks): the first `blocks` entries of every sequence's block table, padded
    with pad_block. The host's per-step work: B * blocks ids, not B * tokens slots; a
    row at a time through numpy (torch.tensor of nested lists took 0.77 ms at batch 32
    and 256 blocks, this 0.17 ms)."""
    out = np.full((len(tables), blocks), pad_block, dtype=np.int64)
    for row, table in zip(out, tables, strict=True):
        row[:len(table)] = table[:blocks]
    return torch.from_numpy(out)


def token_slots(tables: list[list[int]], positions: list[int], block_size: int) -> list[int]:
    """The cache slot of sequence i's token at positions[i]."""
    return [t[p // block_size] * block_size + p % block_size
            for t, p in zip(tables, positions, strict=True)]


def table_slots(table: torch.Tensor, lens: torch.Tensor, block_size: int,
                width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sequence's context slots as one (B, width) tensor plus its (B, width)
    validity mask (positions < len), computed where `table` lives: on the GPU (inside a
    captured decode graph, too) the expansion from blocks to slots costs the host nothing.
    Past a row's table the slots point into its padding block (masked)."""
    span = torch.arange(width, device=table.device)
    slots = table[:, span // block_size] * block_size + span % block_size
    return slots, span.unsqueeze(0) < lens.reshape(-1, 1)


def padded_context_slots(tables: list[list[int]], lens: list[int], block_size: int,
                         width: int, pad_block: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """table_slots of host block tables, on the host."""
    table = block_table(tables, -(-width // block_size), pad_block)
    return table_slots(table, torch.tensor(lens, dtype=torch.long), block_size, width)


def _decode_layout(cache: PagedKVCache, tables: list[list[int]], lens: list[int],
                   device: torch.device) -> BatchLayout:
    """Every sequence adds one token: all contexts as one padded (B, Lmax) slot tensor,
    expanded on the device from the block tables."""
    bs, width = cache.block_size, max(lens)
    table = block_table(tables, -(-width // bs)).to(device)
    length = torch.tensor(lens, dtype=torch.long).to(device)
    write = torch.tensor(token_slots(tables, [n - 1 for n in lens], bs), dtype=torch.long)
    slots, valid = table_slots(table, length, bs, width)
    return BatchLayout(cache, write.to(device), [1] * len(lens), lens, [], True,
                       padded_slots=slots, padded_valid=valid, context_len_t=length)


def paged_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                    value: torch.Tensor, attention_mask: Any, scaling: float | None = None,
                    dropout: float = 0.0, sliding_window: int | None = None,
                    omni_batch: BatchLayout | None = None, **_: Any) -> tuple[torch.Tensor, None]:
    """transformers attention function: query (1, H, N, D), key/value (1, KVH, N, D);
    returns (1, N, H, D) as transformers' own implementations do."""
    if omni_batch is None:
        raise RuntimeError(f"attention '{ATTN_NAME}' needs the engine's batch layout")
    k_cache, v_cache = module.omni_k_cache, module.omni_v_cache  # see bind_cache
    if omni_batch.decode_only:
        lens = omni_batch.context_len_t
        if lens is None:
            lens = torch.tensor(omni_batch.context_lens, device=query.device)
        # traced: the opaque operator; eager: its function (the operator's dispatch costs
        # ~80 us per call on CPU, per layer and step)
        decode = torch.ops.omni.paged_decode if torch.compiler.is_compiling() else decode_step
        out = decode(
            query, key, value, k_cache, v_cache, omni_batch.write_slots,
            omni_batch.padded_slots, omni_batch.padded_valid, lens, scaling,
            sliding_window or 0, omni_batch.cache.decode_kernel)
        return out.unsqueeze(0), None
    _write(key, value, k_cache, v_cache, omni_batch.write_slots)
    if omni_batch.varlen is not None:
        out = varlen_attention(query[0], key[0], value[0], k_cache, v_cache, omni_batch.varlen,
                               scaling, sliding_window)
        return out.unsqueeze(0), None
    attend = _padded_prefill if omni_batch.prefill is not None else _per_sequence
    out = attend(query[0], k_cache, v_cache, omni_batch, scaling, sliding_window)
    return out.unsqueeze(0), None


def _write(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
           v_cache: torch.Tensor, write_slots: torch.Tensor) -> None:
    k_cache.index_copy_(0, write_slots, key[0].transpose(0, 1).to(k_cache.dtype))
    v_cache.index_copy_(0, write_slots, value[0].transpose(0, 1).to(v_cache.dtype))


def decode_step(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, write_slots: torch.Tensor,
                slots: torch.Tensor, valid: torch.Tensor, lens: torch.Tensor,
                scale: float | None, window: int, kernel: str) -> torch.Tensor:
    """A decode step's attention: write the new K/V rows, attend each sequence's single
    query over its context. query (1, H, B, D), key/value (1, KVH, B, D) -> (B, H, D)."""
    _write(key, value, k_cache, v_cache, write_slots)
    q = query[0]
    if kernel == "triton":
        from omni.engines.ar.paged_decode_kernel import paged_decode

        return paged_decode(q, k_cache, v_cache, slots, lens, scale, window or None)
    if kernel == "cpu":
        return cpu_decode_kernel.paged_decode(q, k_cache, v_cache, slots, lens, scale, window)
    return _sdpa_decode(q, k_cache, v_cache, slots, valid, lens, scale, window)


# One opaque operator for a decode step's attention (cache write + attention): under
# torch.compile the model's whole decode forward then traces as ONE graph. Traced as a
# plain function, the Triton launch would break the graph in every layer, and dynamo would
# compile each layer's remainder separately (a recompile per layer and per context bucket:
# seconds of stall when a new bucket is first captured while serving).
paged_decode_op = torch.library.custom_op(
    "omni::paged_decode", decode_step, mutates_args=("k_cache", "v_cache"))


@paged_decode_op.register_fake
def _paged_decode_shape(query: torch.Tensor, *_: Any) -> torch.Tensor:
    return query.new_empty(query.shape[2], query.shape[1], query.shape[3])


def gather_rows(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """cache[slots] for a (slots, KVH, D) cache and any shape of slot ids. index_select
    copies each slot's row whole; advanced indexing (cache[slots]) copies element by
    element on the CPU: 1.40 ms vs 0.26 ms for a decode step's K and V at batch 32 and
    192 tokens of context (4 heads x 64, float32, one thread; min of 200)."""
    return cache.index_select(0, slots.reshape(-1)).view(*slots.shape, *cache.shape[1:])


def gathered(cache: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """gather_rows in the queries' dtype (a narrower cache, option kv_cache_dtype, is
    widened after the gather: SDPA takes one dtype)."""
    return gather_rows(cache, slots).to(dtype)


def _sdpa_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slots: torch.Tensor, valid: torch.Tensor, lens: torch.Tensor,
                 scale: float | None, window: int) -> torch.Tensor:
    """q (H, B, D): one query per sequence, all contexts padded to the longest."""
    k = gathered(k_cache, slots, q.dtype).permute(0, 2, 1, 3)  # (B, KVH, L, D)
    v = gathered(v_cache, slots, q.dtype).permute(0, 2, 1, 3)
    mask = valid
    if window:
        mask = mask & (torch.arange(valid.shape[1], device=valid.device)
                       >= lens.unsqueeze(1) - window)
    out = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(2), k, v,
                                         attn_mask=mask[:, None, None, :], scale=scale,
                                         enable_gqa=k.shape[1] != q.shape[0])
    return out.squeeze(2).contiguous()  # (B, H, D) = (N, H, D)


def _padded_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    layout: BatchLayout, scale: float | None, window: int | None) -> torch.Tensor:
    """q (H, N, D): each padded group's queries in one SDPA call; (N, H, D), packed order."""
    out = q.new_empty(q.shape[1], q.shape[0], q.shape[2])
    for pad in layout.prefill:
        qb = q[:, pad.rows].transpose(0, 1)  # (B, H, Lq, D)
        k = gathered(k_cache, pad.slots, q.dtype).transpose(1, 2)  # (B, KVH, Lk, D)
        v = gathered(v_cache, pad.slots, q.dtype).transpose(1, 2)
        if pad.fresh and not window and qb.is_cuda:
            got = causal_attention(qb, k, v, scale)
        else:
            mask = pad.mask
            if window:
                mask = mask & (pad.key_pos > pad.query_pos - window).unsqueeze(1)
            got = masked_attention(qb, k, v, mask, scale)
        out[pad.rows[pad.valid]] = got.transpose(1, 2)[pad.valid]
    return out


def _per_sequence(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  layout: BatchLayout, scale: float | None, window: int | None) -> torch.Tensor:
    """q (H, N, D): each sequence's query block against its own context."""
    outs, offset = [], 0
    for n, length, slots in zip(layout.query_lens, layout.context_lens, layout.context_slots,
                                strict=True):
        qi = q[:, offset:offset + n].unsqueeze(0)  # (1, H, n, D)
        k = gathered(k_cache, slots, q.dtype).transpose(0, 1).unsqueeze(0)  # (1, KVH, L, D)
        v = gathered(v_cache, slots, q.dtype).transpose(0, 1).unsqueeze(0)
        if n == length and not window and q.is_cuda:  # a whole prompt: no mask needed
            outs.append(causal_attention(qi, k, v, scale)[0].transpose(0, 1))
            offset += n
            continue
        pos_q = torch.arange(length - n, length, device=q.device).unsqueeze(1)
        pos_k = torch.arange(length, device=q.device).unsqueeze(0)
        mask = pos_k <= pos_q
        if window:
            mask = mask & (pos_k > pos_q - window)
        out = masked_attention(qi, k, v, mask, scale)
        outs.append(out[0].transpose(0, 1))  # (n, H, D)
        offset += n
    return torch.cat(outs)


def register() -> None:
    """Make ``attn_implementation=ATTN_NAME`` known to transformers (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, paged_attention)
