"""Prefill steps in paged attention (omni/engines/ar/paged_attention.py): a batch of prompt
chunks padded into one SDPA call equals one call per sequence, with cached prefixes,
uneven lengths and sliding windows; batches that padding would bloat stay per sequence."""

from __future__ import annotations

import random

import pytest
import torch

from omni.engines.ar import paged_attention as pa
from omni.engines.ar.kv_cache import PagedKVCache

torch.set_num_threads(1)
H, KVH, D, BS = 4, 2, 8, 4


def _step(starts: list[int], query_lens: list[int], seed: int = 0):
    """A cache whose sequences hold random cached prefixes, their block tables (shuffled
    blocks) and one step's packed query/key/value."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    cache = PagedKVCache(1, KVH, D, 64, BS, torch.float32, torch.device("cpu"))
    cache.k[0].normal_()
    cache.v[0].normal_()
    blocks = list(range(1, 64))
    rng.shuffle(blocks)
    tables = []
    for start, n in zip(starts, query_lens, strict=True):
        need = -(-(start + n) // BS)
        tables.append([blocks.pop() for _ in range(need)])
    total = sum(query_lens)
    q, k, v = (torch.randn(1, heads, total, D) for heads in (H, KVH, KVH))
    return cache, tables, q, k, v


class _Layer(torch.nn.Module):
    def __init__(self, cache: PagedKVCache) -> None:
        super().__init__()
        self.omni_k_cache, self.omni_v_cache = cache.k[0], cache.v[0]


def _attend(cache, tables, starts, query_lens, q, k, v, window, padded: bool):
    layout = pa.build_layout(cache, tables, starts, query_lens, torch.device("cpu"))
    assert (layout.prefill is not None) is padded
    k_cache, v_cache = cache.k[0].clone(), cache.v[0].clone()  # each path writes its own
    layer = _Layer(cache)
    layer.omni_k_cache, layer.omni_v_cache = k_cache, v_cache
    out, _ = pa.paged_attention(layer, q, k, v, None, scaling=D ** -0.5,
                                sliding_window=window, omni_batch=layout)
    return out, k_cache


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("starts, query_lens", [
    ([0, 0, 0], [7, 9, 8]),          # a burst of fresh prompts
    ([4, 0, 8, 2], [6, 9, 5, 7]),    # some with cached prefixes
    ([0, 4], [8, 1]),                # a prompt chunk beside a decode row
])
def test_padded_prefill_equals_per_sequence(starts, query_lens, window, monkeypatch):
    cache, tables, q, k, v = _step(starts, query_lens)
    got, got_cache = _attend(cache, tables, starts, query_lens, q, k, v, window, padded=True)
    monkeypatch.setattr(pa, "_pads_cheaply", lambda *_: False)
    want, want_cache = _attend(cache, tables, starts, query_lens, q, k, v, window, padded=False)
    assert got.shape == want.shape == (1, sum(query_lens), H, D)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_cache, want_cache, rtol=0, atol=0)  # same slots written


def test_padding_that_would_bloat_the_work_stays_per_sequence():
    assert pa._pads_cheaply([8, 8, 8], [8, 12, 8])
    assert not pa._pads_cheaply([64, 1, 1, 1], [64, 40, 40, 40])  # a long chunk + decodes
    assert not pa._pads_cheaply([9], [9])  # one sequence: nothing to batch
    assert pa._pads_cheaply([128] * 32, [128] * 32)
    assert not pa._pads_cheaply([2500] * 3, [2500] * 3)  # long prompts: within the limit
