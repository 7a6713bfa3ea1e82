"""The static-buffer fill of the CUDA-graph decode path, checked on CPU against the
slot arithmetic written out per row (the capture itself is tested in tests/gpu)."""

from __future__ import annotations

import torch

from omni.engines.decode_graphs import DecodeGraphs
from omni.engines.kv_cache import PagedKVCache


def _graphs_without_cuda(batch: int, length: int) -> DecodeGraphs:
    cache = PagedKVCache(1, 1, 4, 64, 4, torch.float32, torch.device("cpu"))
    graphs = DecodeGraphs.__new__(DecodeGraphs)  # only the buffers, no CUDA pool
    graphs.cache, graphs.scratch = cache, cache.pool.allocate() * cache.block_size
    for name, shape, dtype in (("ids", (1, batch), torch.long),
                               ("positions", (1, batch), torch.long),
                               ("write", (batch,), torch.long),
                               ("slots", (batch, length), torch.long),
                               ("valid", (batch, length), torch.bool),
                               ("lens", (batch,), torch.long)):
        setattr(graphs, name, torch.zeros(shape, dtype=dtype))
    return graphs


def test_fill_matches_per_row_slots_and_pads_with_scratch():
    graphs = _graphs_without_cuda(4, 16)
    tables, positions = [[5, 9, 2], [7], [3, 4]], [9, 2, 5]
    graphs._fill([11, 12, 13], positions, tables, 4, 16)
    for i, (p, table) in enumerate(zip(positions, tables, strict=True)):
        expected = [table[k // 4] * 4 + k % 4 for k in range(p + 1)]
        assert graphs.slots[i, :p + 1].tolist() == expected
        assert graphs.valid[i].tolist() == [k <= p for k in range(16)]
        assert graphs.write[i] == expected[-1]  # the new token goes to its own slot
    assert graphs.ids[0].tolist() == [11, 12, 13, 0]
    assert graphs.lens.tolist() == [10, 3, 6, 1]
    # the padding row writes to and attends to the scratch slot only
    assert graphs.write[3] == graphs.scratch
    assert graphs.slots[3].unique().tolist() == [graphs.scratch]
    assert graphs.valid[3].tolist() == [True] + [False] * 15


def test_fill_with_only_padding_rows_as_at_warm_up():
    graphs = _graphs_without_cuda(2, 16)
    graphs._fill([], [], [], 2, 16)
    assert graphs.write.tolist() == [graphs.scratch] * 2
    assert graphs.slots.unique().tolist() == [graphs.scratch]
    assert graphs.valid[:, 0].all() and not graphs.valid[:, 1:].any()
