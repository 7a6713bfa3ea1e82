"""omni/heap.py: what exists after loading is frozen out of garbage collection."""

from __future__ import annotations

import gc

from omni.heap import freeze_loaded_objects


def test_loaded_objects_are_frozen_and_new_garbage_is_still_collected() -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self  # a cycle: only the cyclic collector frees it

    loaded = [Node() for _ in range(1000)]
    try:
        frozen = freeze_loaded_objects()
        # another thread of this process (a test server still up, beating heartbeats) may
        # free a few frozen objects meanwhile, never add to them
        assert frozen >= 1000 and frozen - 1000 < gc.get_freeze_count() <= frozen
        tracked = {id(o) for o in gc.get_objects()}
        assert not any(id(node) in tracked for node in loaded)  # skipped by collections
        Node()  # new garbage, unreachable at once
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()


def test_gc_pauses_are_recorded_once_and_bounded() -> None:
    from omni.heap import MAX_PAUSES, GcPauses

    pauses = GcPauses(min_s=0.0)
    try:
        gc.collect()
        gc.disable()  # only the explicit collections below
        first = pauses.take()
        assert len(first) >= 1 and all(p >= 0 for p in first)
        assert pauses.take() == []  # taken once
        for _ in range(MAX_PAUSES + 5):
            gc.collect(0)
        assert len(pauses.take()) == MAX_PAUSES
    finally:
        gc.enable()
        pauses.close()
    gc.collect()
    assert pauses.take() == []  # closed: no longer called


def test_gc_pause_totals_and_samples() -> None:
    from omni.heap import GcPauses

    pauses = GcPauses(min_s=0.0)
    try:
        gc.collect()
        gc.collect()
        gc.disable()  # no collection between the samples and the checks
        assert pauses.count >= 2 and pauses.total_s >= pauses.max_s > 0
        samples = {name: (kind, labels, value)
                   for kind, name, _, labels, value in pauses.samples("server")}
        assert samples["omni_gc_pauses"] == ("counter", {"process": "server"}, pauses.count)
        assert samples["omni_gc_pause_max_seconds"][2] == pauses.max_s
    finally:
        gc.enable()
        pauses.close()
