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
        assert frozen >= 1000 and gc.get_freeze_count() == frozen
        tracked = {id(o) for o in gc.get_objects()}
        assert not any(id(node) in tracked for node in loaded)  # skipped by collections
        Node()  # new garbage, unreachable at once
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()
