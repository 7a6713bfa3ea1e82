"""Keep CPython's cyclic garbage collector from pausing a serving process for long.

A process with a model loaded holds a great many long-lived objects (modules, parameters,
configuration trees, imported code), and a full (generation-2) collection walks all of
them. A burst of request messages, hundreds of small dicts and lists each, is enough to
trigger one: it took 0.36 s in a spoken-answer pipeline's vocoder process and 0.50 s in its
talker (`bench omni`, tiny model, full delivery, c=32, 2-core VM), and every request of that
burst waited behind it. `gc.freeze()` moves what exists once loading is done into a permanent generation
that collections skip; the garbage that requests make is still collected.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterable


def freeze_loaded_objects() -> int:
    """Collect once, then take every surviving object out of later collections; returns
    how many objects are frozen (the process's count, for its READY report)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


MAX_PAUSES = 64  # pauses kept between two reports (later ones are dropped)


class GcPauses:
    """How long this process's garbage collections take, for its engine reports: a pause
    holds every request of the stage, and only a measurement tells a slow step from one.
    Collections shorter than `min_s` are common and harmless, and are not kept."""

    def __init__(self, min_s: float = 0.001) -> None:
        self.min_s = min_s
        self._started = 0.0
        self._pauses: list[float] = []
        self.count, self.total_s, self.max_s = 0, 0.0, 0.0  # since start, those kept only
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        # runs inside the collection: record a float, allocate as little as possible
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        if took < self.min_s:
            return
        self.count += 1
        self.total_s += took
        self.max_s = max(self.max_s, took)
        if len(self._pauses) < MAX_PAUSES:
            self._pauses.append(round(took, 6))

    def samples(self, process: str) -> Iterable[tuple[str, str, str, dict[str, str], float]]:
        """Scrape-time metrics of this process's pauses (omni.runtime.metrics.Metrics.watch)."""
        labels = {"process": process}
        yield "counter", "omni_gc_pauses", "Garbage collections of 1 ms or more", labels, \
            self.count
        yield "counter", "omni_gc_pause_seconds", "Time in garbage collections of 1 ms or " \
            "more (every request of the process waits)", labels, self.total_s
        yield "gauge", "omni_gc_pause_max_seconds", "The longest garbage collection", labels, \
            self.max_s

    def take(self) -> list[float]:
        """Pauses (s) since the last call."""
        pauses, self._pauses = self._pauses, []
        return pauses

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
