"""The static-buffer fill of the CUDA-graph decode path, checked on CPU against the
slot arithmetic written out per row (the capture itself is tested in tests/gpu)."""

from __future__ import annotations

import torch

from omni.engines.ar.decode_graphs import DecodeGraphs
from omni.engines.ar.kv_cache import PagedKVCache


def _graphs_without_cuda(batch: int, length: int) -> DecodeGraphs:
    """Only the static buffers (on the CPU): the graph pool is made at the first capture."""
    cache = PagedKVCache(1, 1, 4, 64, 4, torch.float32, torch.device("cpu"))
    return DecodeGraphs(None, cache, batch, length, torch.device("cpu"))


def test_fill_matches_per_row_slots_and_pads_with_scratch():
    graphs = _graphs_without_cuda(4, 16)
    tables, positions = [[5, 9, 2], [7], [3, 4]], [9, 2, 5]
    graphs._fill([11, 12, 13], positions, tables, 4, 16)
    layout = graphs._layout(4, 16)  # the slots the graph expands from the block tables
    for i, (p, table) in enumerate(zip(positions, tables, strict=True)):
        expected = [table[k // 4] * 4 + k % 4 for k in range(p + 1)]
        assert layout.padded_slots[i, :p + 1].tolist() == expected
        assert layout.padded_valid[i].tolist() == [k <= p for k in range(16)]
        assert graphs.write[i] == expected[-1]  # the new token goes to its own slot
    assert graphs.ids[0].tolist() == [11, 12, 13, 0]
    assert graphs.lens.tolist() == [10, 3, 6, 1]
    # the padding row writes to and attends to the scratch slot only
    assert graphs.write[3] == graphs.scratch
    assert layout.padded_slots[3, 0] == graphs.scratch
    assert layout.padded_slots[3].div(4, rounding_mode="floor").unique().tolist() == \
        [graphs.scratch // 4]
    assert layout.padded_valid[3].tolist() == [True] + [False] * 15


def test_fill_with_only_padding_rows_as_at_warm_up():
    graphs = _graphs_without_cuda(2, 16)
    graphs._fill([], [], [], 2, 16)
    layout = graphs._layout(2, 16)
    assert graphs.write.tolist() == [graphs.scratch] * 2
    assert layout.padded_slots[:, 0].tolist() == [graphs.scratch] * 2
    assert layout.padded_valid[:, 0].all() and not layout.padded_valid[:, 1:].any()


def test_a_smaller_context_bucket_reads_only_its_own_blocks():
    """The buffers are sized for the largest bucket; a smaller one must expand only its
    own blocks, whatever a larger fill left in the rest."""
    graphs = _graphs_without_cuda(2, 32)
    graphs._fill([1, 2], [30, 29], [[1, 2, 3, 4, 5, 6, 7, 8]] * 2, 2, 32)
    graphs._fill([1], [5], [[9, 10]], 2, 8)
    layout = graphs._layout(2, 8)
    assert layout.padded_slots.shape == (2, 8)
    assert layout.padded_slots[0].tolist() == [36, 37, 38, 39, 40, 41, 42, 43]
    assert layout.padded_valid[0].tolist() == [True] * 6 + [False] * 2
