"""Decode attention that reads the paged KV cache in place (Triton).

The portable decode path (``paged_attention._decode``) gathers every sequence's context
into a padded (B, KVH, L, D) copy and runs one masked SDPA call: per layer it reads the
context, writes a copy, and reads it again; and with a mask plus grouped-query heads
PyTorch's fused SDPA kernels do not apply, so its math path also expands K/V to every
query head. This kernel reads each cached K/V row once, straight from its slot:

- one program per (sequence, KV head, split of the context): the GROUP query heads that
  share a KV head are one small matrix, so each K/V tile is loaded once for all of them;
- it stops at each sequence's own length (read from a device tensor, so a CUDA graph
  captured for a padded context bucket reads no padding);
- long contexts are cut into splits (flash-decoding) so a small batch still fills the
  GPU; a second tiny kernel merges the splits' partial softmaxes.

Written here rather than taken from a package because the cache layout is ours (one
(slots, KVH, D) tensor per layer, slot = block * block_size + offset); flash-attn's and
vllm's paged kernels expect their own layouts and are not installable on every box.
Tested against SDPA on CPU under TRITON_INTERPRET=1 and on CUDA (tests/gpu).
"""

from __future__ import annotations

import functools
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the engine falls back to the SDPA path
    triton = None

BLOCK_N = 64  # context tokens per tile (4 cache blocks of 16)
# The split count is a runtime argument (not a compile-time constant), so the kernels
# compile once per model and dtype, at warm-up, rather than again for each new split
# count while serving (each compile would stall a lazy graph capture).
MAX_SPLITS = 32


def available() -> bool:
    return triton is not None


def interpreted() -> bool:
    """Triton runs its kernels on the CPU through its interpreter (slow; for tests)."""
    return available() and os.environ.get("TRITON_INTERPRET") == "1"


if triton is not None:

    @triton.jit(do_not_specialize=["splits"])
    def _split_kernel(Q, K, V, Slots, Lens, Out, Acc, M, L,
                      stride_qb, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh,
                      stride_sb, scale, window, split_len, splits,
                      NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                      HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, BLOCK: tl.constexpr,
                      SINGLE: tl.constexpr, IEEE: tl.constexpr):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        split = tl.program_id(2)
        length = tl.load(Lens + b).to(tl.int32)
        lo = split * split_len
        hi = tl.minimum(lo + split_len, length)
        if window > 0:
            lo = tl.maximum(lo, length - window)
        g = tl.arange(0, GROUP_PAD)
        heads = kvh * GROUP + g
        d = tl.arange(0, DIM_PAD)
        qmask = (g < GROUP)[:, None] & (d < HEAD_DIM)[None, :]
        q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=qmask,
                    other=0.0)
        m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
        for start in range(lo, hi, BLOCK):
            n = start + tl.arange(0, BLOCK)
            nmask = n < hi
            slot = tl.load(Slots + b * stride_sb + n, mask=nmask, other=0).to(tl.int64)
            kvmask = nmask[:, None] & (d < HEAD_DIM)[None, :]
            k = tl.load(K + slot[:, None] * stride_kn + kvh * stride_kh + d[None, :],
                        mask=kvmask, other=0.0)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = tl.where(nmask[None, :], s * scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + slot[:, None] * stride_vn + kvh * stride_vh + d[None, :],
                        mask=kvmask, other=0.0)
            if IEEE:
                pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        if SINGLE:
            out = acc / l_i[:, None]
            dst = Out + (b * NUM_HEADS + heads[:, None]) * HEAD_DIM + d[None, :]
            tl.store(dst, out.to(Out.dtype.element_ty), mask=qmask)
        else:
            row = (b * NUM_HEADS + heads) * splits + split  # (GROUP_PAD,)
            gmask = g < GROUP
            tl.store(M + row, m_i, mask=gmask)
            tl.store(L + row, l_i, mask=gmask)
            tl.store(Acc + row[:, None] * DIM_PAD + d[None, :], acc, mask=gmask[:, None])

    @triton.jit(do_not_specialize=["splits"])
    def _merge_kernel(Out, Acc, M, L, splits, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
                      SPLITS_PAD: tl.constexpr):
        row = tl.program_id(0)  # b * NUM_HEADS + head
        s = tl.arange(0, SPLITS_PAD)
        smask = s < splits
        d = tl.arange(0, DIM_PAD)
        m = tl.load(M + row * splits + s, mask=smask, other=float("-inf"))
        weight = tl.where(smask, tl.exp(m - tl.max(m, 0)), 0.0)  # empty splits: exp(-inf)=0
        denom = tl.sum(weight * tl.load(L + row * splits + s, mask=smask, other=0.0), 0)
        acc = tl.load(Acc + (row * splits + s[:, None]) * DIM_PAD + d[None, :],
                      mask=smask[:, None], other=0.0)
        out = tl.sum(acc * weight[:, None], 0) / denom
        tl.store(Out + row * HEAD_DIM + d, out.to(Out.dtype.element_ty), mask=d < HEAD_DIM)


@functools.lru_cache(maxsize=8)
def _processors(device: torch.device) -> int:
    if device.type != "cuda":
        return 8  # the CPU interpreter (tests): a few splits, so the merge path runs
    return torch.cuda.get_device_properties(device).multi_processor_count


def _pow2(n: int, floor: int = 16) -> int:
    return max(floor, 1 << (n - 1).bit_length())


def plan_splits(batch: int, kv_heads: int, width: int, processors: int) -> tuple[int, int]:
    """(splits, tokens per split): enough programs for about two waves of the GPU's
    processors, but no split shorter than two tiles. Planned from the batch and width
    rounded up to powers of two (width at least 256), so an eager step and a CUDA graph
    captured for a padded bucket split a sequence alike and give bit-identical results."""
    batch, width = _pow2(batch, 1), _pow2(width, 256)
    tiles = width // BLOCK_N
    want = -(-2 * processors // (batch * kv_heads))
    splits = max(1, min(want, tiles // 2, MAX_SPLITS))
    split_len = -(-tiles // splits) * BLOCK_N
    return -(-width // split_len), split_len


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slots: torch.Tensor, lens: torch.Tensor, scale: float | None,
                 window: int | None) -> torch.Tensor:
    """q (H, B, D) one query per sequence; k/v_cache (slots, KVH, D); slots (B, W) each
    sequence's context slots in order (padding past lens[b] is never read); lens (B,).
    Returns (B, H, D) like the SDPA path."""
    heads, batch, dim = q.shape
    kv_heads = k_cache.shape[1]
    q = q if q.stride(2) == 1 else q.contiguous()
    group = heads // kv_heads
    scale = dim ** -0.5 if scale is None else scale
    splits, split_len = plan_splits(batch, kv_heads, slots.shape[1], _processors(q.device))
    out = torch.empty(batch, heads, dim, dtype=q.dtype, device=q.device)
    dim_pad = _pow2(dim)
    if splits > 1:
        acc = torch.empty(batch * heads * splits, dim_pad, dtype=torch.float32, device=q.device)
        m = torch.empty(batch * heads * splits, dtype=torch.float32, device=q.device)
        partial_l = torch.empty_like(m)
    else:
        acc = m = partial_l = out  # unused by the kernel when SINGLE
    _split_kernel[(batch, kv_heads, splits)](
        q, k_cache, v_cache, slots, lens, out, acc, m, partial_l,
        q.stride(1), q.stride(0), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), slots.stride(0), float(scale),
        int(window or 0), split_len, splits,
        NUM_HEADS=heads, GROUP=group, GROUP_PAD=_pow2(group), HEAD_DIM=dim, DIM_PAD=dim_pad,
        BLOCK=BLOCK_N, SINGLE=splits == 1, IEEE=k_cache.dtype == torch.float32, num_warps=4)
    if splits > 1:
        _merge_kernel[(batch * heads,)](out, acc, m, partial_l, splits, HEAD_DIM=dim,
                                        DIM_PAD=dim_pad, SPLITS_PAD=MAX_SPLITS)
    return out
