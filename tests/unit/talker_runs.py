"""What the talker tests of Qwen3-Omni and Qwen2.5-Omni share (test_talker.py,
test_omni25_talker.py): a talker fed its thinker's outputs as a stream, step by step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omni.engines.base import EngineRequest

GREEDY = {"temperature": 0}


def run_talker(talker: Any, feeds: dict[str, list], max_tokens: int = 12, params=None,
               interleave: bool = True, frame: Callable[[Any], Any] = lambda codes: codes
               ) -> dict[str, list]:
    """Feed each request's thinker outputs one per engine step (all at once without
    ``interleave``); per request its frames, each output's codes through ``frame``."""
    for rid in feeds:
        talker.add(EngineRequest(rid, {"stream": ["thinker"]},
                                 {**GREEDY, "max_tokens": max_tokens, **(params or {})}))
    frames: dict[str, list] = {rid: [] for rid in feeds}
    pending = {rid: list(outs) for rid, outs in feeds.items()}
    seqno = dict.fromkeys(feeds, 0)
    done: set[str] = set()
    while len(done) < len(feeds):
        for rid, outs in pending.items():
            for _ in range(1 if interleave else len(outs)):
                if outs:
                    data, last = outs.pop(0)
                    talker.append(rid, "thinker", seqno[rid], data, last)
                    seqno[rid] += 1
        for o in talker.step():
            assert o.error is None, o.error
            if o.data and o.data.get("codes"):
                frames[o.request_id].append(frame(o.data["codes"]))
            if o.finished:
                done.add(o.request_id)
    return frames
