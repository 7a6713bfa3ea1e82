"""Paged KV cache: fixed-size blocks shared by all sequences, with prefix caching.

Memory: one K and one V tensor per layer, each ``(num_blocks * block_size, kv_heads,
head_dim)``; token ``t`` of a sequence lives in slot ``table[t // block_size] *
block_size + t % block_size``. The number of blocks comes from a byte budget, so the
cache never grows after start-up and running out is a scheduling event (wait, preempt
or refuse), never an allocation failure in the middle of a step.

Prefix caching: a *full* block is identified by the hash of its tokens chained with the
hash of the block before it, so equal hashes mean equal prefixes. A block whose last
user left keeps its content and hash ("cached") until the space is needed; a new
sequence whose prompt starts with cached blocks takes them instead of recomputing.
Blocks are reference counted: a prefix shared by many running sequences is stored once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from omni.engines.base import EngineLoadError


class OutOfBlocksError(RuntimeError):
    """No free or cached block is left (the scheduler waits, preempts or refuses)."""


class BlockPool:
    """Block ids, reference counts, and the prefix-cache index."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need >= 1 block of >= 1 token, got {num_blocks} x {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        self._refs = [0] * num_blocks
        self._hash_of: dict[int, int] = {}  # block -> prefix hash (full, cached blocks)
        self._block_of: dict[int, int] = {}  # prefix hash -> block
        self._cached: OrderedDict[int, None] = OrderedDict()  # unused hashed blocks, LRU
        self.hits = 0  # prefix-cache blocks reused

    @property
    def available(self) -> int:
        """Blocks a new allocation can get (free + cached but unused)."""
        return len(self._free) + len(self._cached)

    @property
    def used(self) -> int:
        return self.num_blocks - self.available

    def allocate(self) -> int:
        if self._free:
            block = self._free.pop()
        elif self._cached:
            block, _ = self._cached.popitem(last=False)  # evict the least recently used
            del self._block_of[self._hash_of.pop(block)]
        else:
            raise OutOfBlocksError("the KV cache is full")
        self._refs[block] = 1
        return block

    def release(self, block: int) -> None:
        refs = self._refs[block] - 1
        if refs < 0:
            raise RuntimeError(f"block {block} released more often than taken")
        self._refs[block] = refs
        if refs == 0:
            if block in self._hash_of:
                self._cached[block] = None  # content stays valid for a later prefix hit
            else:
                self._free.append(block)

    def lookup(self, prefix_hash: int) -> int | None:
        """The cached block holding this prefix (now referenced once more), or None."""
        block = self._block_of.get(prefix_hash)
        if block is None:
            return None
        if self._refs[block] == 0:
            del self._cached[block]
        self._refs[block] += 1
        self.hits += 1
        return block

    def publish(self, block: int, prefix_hash: int) -> None:
        """A block just became full: make its prefix findable (first writer wins)."""
        if prefix_hash not in self._block_of and block not in self._hash_of:
            self._block_of[prefix_hash] = block
            self._hash_of[block] = prefix_hash


def block_hashes(tokens: Sequence[int], block_size: int, salt: int = 0) -> list[int]:
    """Chained hashes of every full block of tokens (salt separates e.g. models)."""
    hashes, prev = [], salt
    for start in range(0, len(tokens) - block_size + 1, block_size):
        prev = hash((prev, tuple(tokens[start:start + block_size])))
        hashes.append(prev)
    return hashes


@dataclass
class SequenceBlocks:
    """One sequence's place in the cache."""

    table: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)  # of its full blocks, as published
    cached_tokens: int = 0  # prompt tokens found in the prefix cache

    def slots(self, start: int, end: int, block_size: int) -> list[int]:
        return [self.table[t // block_size] * block_size + t % block_size
                for t in range(start, end)]


class PagedKVCache:
    """The cache tensors plus the block bookkeeping of every sequence."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, num_blocks: int,
                 block_size: int, dtype: torch.dtype, device: torch.device,
                 decode_kernel: str = "sdpa") -> None:
        self.pool = BlockPool(num_blocks, block_size)
        self.block_size = block_size
        shape = (num_blocks * block_size, kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.decode_kernel = decode_kernel  # "sdpa", "triton" or "cpu": paged_attention.decode_step
        # "varlen" (flash attention over the packed step, varlen_prefill.py) or "sdpa"
        self.prefill_kernel = "sdpa"
        self.block_bytes = self.bytes_per_block(num_layers, kv_heads, head_dim, block_size, dtype)

    @staticmethod
    def bytes_per_block(num_layers: int, kv_heads: int, head_dim: int, block_size: int,
                        dtype: torch.dtype) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * kv_heads * head_dim * itemsize

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def attach_prefix(self, seq: SequenceBlocks, prompt: Sequence[int], salt: int = 0) -> int:
        """Take the cached blocks of the prompt's longest cached prefix; returns the
        number of tokens whose KV is already there. The last prompt token is always
        recomputed (its logits are needed)."""
        usable = (len(prompt) - 1) // self.block_size
        for h in block_hashes(prompt, self.block_size, salt)[:usable]:
            block = self.pool.lookup(h)
            if block is None:
                break
            seq.table.append(block)
            seq.hashes.append(h)
        seq.cached_tokens = len(seq.table) * self.block_size
        return seq.cached_tokens

    def grow(self, seq: SequenceBlocks, total_tokens: int) -> None:
        """Make room for total_tokens; OutOfBlocksError (nothing taken) if it cannot."""
        need = self.blocks_for(total_tokens) - len(seq.table)
        if need > self.pool.available:
            raise OutOfBlocksError(f"need {need} more blocks, {self.pool.available} available")
        for _ in range(max(need, 0)):
            seq.table.append(self.pool.allocate())

    def publish_full(self, seq: SequenceBlocks, tokens: Sequence[int], salt: int = 0) -> None:
        """Publish the blocks that became full (their tokens' KV is written)."""
        full = len(tokens) // self.block_size
        if full <= len(seq.hashes):
            return
        prev = seq.hashes[-1] if seq.hashes else salt
        for i in range(len(seq.hashes), full):
            block_tokens = tuple(tokens[i * self.block_size:(i + 1) * self.block_size])
            prev = hash((prev, block_tokens))
            self.pool.publish(seq.table[i], prev)
            seq.hashes.append(prev)

    def free(self, seq: SequenceBlocks) -> None:
        for block in seq.table:
            self.pool.release(block)
        seq.table.clear()
        seq.hashes.clear()


def sized_cache(lm: Any, options: dict[str, Any], memory_bytes: int | None,
                opt: Callable[[str, int], int]) -> PagedKVCache:
    """The KV cache of an AR stage, sized by (first that applies) option kv_cache_blocks;
    the stage's `memory` (what the weights leave, at most every sequence at full length);
    option kv_cache_mb; on CUDA kv_cache_fraction of the free memory; else 256 MiB."""
    cfg = lm.config
    layers, kv_heads = cfg.num_hidden_layers, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    block_size = opt("block_size", 16)
    dtype = cache_dtype(options.get("kv_cache_dtype", "auto"), lm.dtype, lm.device)
    per_block = PagedKVCache.bytes_per_block(layers, kv_heads, head_dim, block_size, dtype)
    if "kv_cache_blocks" in options:
        blocks = opt("kv_cache_blocks", 1)
    elif memory_bytes is not None:  # what the weights leave of the stage's budget
        weights = sum(p.numel() * p.element_size() for p in lm.model.parameters())
        blocks = (memory_bytes - weights) // per_block
        if blocks < 2:
            raise EngineLoadError(
                f"the stage's memory ({memory_bytes / 2**20:.0f} MiB) leaves no room "
                f"for a KV cache after the weights ({weights / 2**20:.0f} MiB); raise it")
        if lm.max_positions:  # no more than every sequence at full length
            blocks = min(blocks, opt("max_num_seqs", 64) * -(-lm.max_positions // block_size))
    elif lm.device.type == "cuda" and "kv_cache_mb" not in options:
        free, _ = torch.cuda.mem_get_info(lm.device)
        blocks = int(free * float(options.get("kv_cache_fraction", 0.85))) // per_block
    else:
        blocks = opt("kv_cache_mb", 256) * 2**20 // per_block
    if blocks < 2:
        raise EngineLoadError(f"the KV cache budget holds {blocks} blocks of {block_size} "
                              "tokens; give the stage more memory")
    kernel = decode_kernel(options.get("attention_kernel", "auto"), lm.device, head_dim)
    cache = PagedKVCache(layers, kv_heads, head_dim, blocks, block_size, dtype, lm.device,
                         kernel)
    cache.prefill_kernel = prefill_kernel(options.get("prefill_attention", "auto"), lm.device,
                                          lm.dtype)
    return cache


CACHE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16,
                "float32": torch.float32}


def cache_dtype(choice: Any, model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """Option kv_cache_dtype: `auto` (the model's dtype) or a narrower one under a float32
    model on the CPU: half the bytes a decode step's attention reads (it is bound by them
    there) and twice the tokens a budget holds, the rows rounded once when written."""
    if choice in ("auto", None):
        return model_dtype
    dtype = CACHE_DTYPES.get(choice) if isinstance(choice, str) else None
    if dtype is None:
        raise EngineLoadError(f"option kv_cache_dtype: {choice!r} is not one of auto, "
                              f"{', '.join(CACHE_DTYPES)}")
    if dtype != model_dtype and (device.type != "cpu" or model_dtype != torch.float32):
        raise EngineLoadError(
            f"option kv_cache_dtype: {choice} differs from the model's {model_dtype} "
            f"on {device.type}; a narrower cache is served on the CPU under a float32 model "
            "only (use auto)")
    return dtype


def prefill_kernel(choice: str, device: torch.device, dtype: torch.dtype) -> str:
    """A prefill step's attention: "varlen" (one flash-attention call over the packed
    sequences; the default where it runs: CUDA, half precision) or "sdpa" (padded or
    per-sequence SDPA calls; CPU and CUDA)."""
    from omni.engines.ar.varlen_prefill import usable

    if choice not in ("auto", "varlen", "sdpa"):
        raise EngineLoadError(f"option prefill_attention must be auto, varlen or sdpa, "
                              f"got {choice!r}")
    if choice == "varlen" and not usable(device, dtype):
        raise EngineLoadError("prefill_attention: varlen needs CUDA, bfloat16 or float16 and "
                              "a torch with torch.nn.attention.varlen")
    return "varlen" if choice != "sdpa" and usable(device, dtype) else "sdpa"


def decode_kernel(choice: str, device: torch.device, head_dim: int = 0) -> str:
    """The decode attention kernel: "triton" (reads the paged cache in place; the default
    on CUDA when Triton imports), "cpu" (reads it in place on the CPU, a C++ operator built
    at first use; the default on CPU when it builds: cpu_decode_kernel.py) or "sdpa"
    (gather + one SDPA call; CPU and CUDA, and the fallback)."""
    from omni.engines.ar import cpu_decode_kernel, paged_decode_kernel

    if choice not in ("auto", "triton", "cpu", "sdpa"):
        raise EngineLoadError(f"option attention_kernel must be auto, triton, cpu or sdpa, "
                              f"got {choice!r}")
    on_cuda = device.type == "cuda" and paged_decode_kernel.available()
    if choice == "auto":
        if device.type == "cpu":
            fits = head_dim <= cpu_decode_kernel.MAX_HEAD_DIM
            return "cpu" if fits and cpu_decode_kernel.available() else "sdpa"
        return "triton" if on_cuda else "sdpa"
    # on CPU only under Triton's interpreter (TRITON_INTERPRET=1): tests, not serving
    if choice == "triton" and not (on_cuda or paged_decode_kernel.interpreted()):
        raise EngineLoadError("attention_kernel: triton needs CUDA and the triton package")
    if choice == "cpu" and device.type != "cpu":
        raise EngineLoadError(f"attention_kernel: cpu runs on the CPU, the stage is on "
                              f"{device.type}")
    if choice == "cpu" and head_dim > cpu_decode_kernel.MAX_HEAD_DIM:
        raise EngineLoadError(f"attention_kernel: cpu takes a head_dim up to "
                              f"{cpu_decode_kernel.MAX_HEAD_DIM}, the model's is {head_dim}")
    if choice == "cpu" and not cpu_decode_kernel.available():
        raise EngineLoadError(f"attention_kernel: cpu is unavailable: "
                              f"{cpu_decode_kernel.unavailable_reason()}")
    return choice
