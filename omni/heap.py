"""Keep CPython's cyclic garbage collector from pausing a serving process for long.

A process with a model loaded holds a great many long-lived objects (modules, parameters,
configuration trees, imported code), and a full (generation-2) collection walks all of
them. A burst of request messages, hundreds of small dicts and lists each, is enough to
trigger one: it took 0.36 s in the tiny Qwen3-Omni's code2wav process and 0.50 s in its
talker (bench omni, full delivery, c=32, 2-core VM), and every request of that burst waited
behind it. `gc.freeze()` moves what exists once loading is done into a permanent generation
that collections skip; the garbage that requests make is still collected.
"""

from __future__ import annotations

import gc


def freeze_loaded_objects() -> int:
    """Collect once, then take every surviving object out of later collections; returns
    how many objects are frozen (the process's count, for its READY report)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
