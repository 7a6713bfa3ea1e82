"""Gathering, shared by the engine kinds that batch requests (ar/ for media prompts,
generation/): a batch that waits for the rest of a burst before it starts.

Requests sent together do not reach an engine together. Each crosses the front end in
turn (body read, base64 or audio decoded, headers checked: ~1.3 ms a 112 px image, ~6 ms
a 448 px one on a 2-core VM), so a burst of 8 arrives spread over 10-50 ms. An engine
that starts a batch on the first arrival runs it alone and the rest wait for it: 8 image
chats at once through HTTP had 2-4x the TTFT of the same 8 added at once in-process
(bench vlm), and 8 speech transcriptions on an H100 took 3.2 s where one call of all 8
took 2.0 and a clip alone 1.0 (bench vlm's speech row in bench/results/README.md; a CPU
trace showed the first clip's call alone, then the other 7's).

So a batch that finds its engine idle waits until no request has arrived for ``gap_s``,
and at most ``GATHER_CAP`` gaps after its first (a steady trickle cannot hold it back);
a lone request pays one gap. The engine reports the wait through Engine.gather_s, and
the process loop waits on its socket meanwhile, reading the arrivals (omni/engines/proc/
loop.py); a caller that steps an engine itself has nothing more to add, so a step runs
the batch at once. The AR engine's media encoder gathers by default (encode_gather_ms,
omni/engines/ar/encoder.py); the generation engine only with option gather_ms.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from omni.engines.base import number_option

# the most gaps a gathering batch waits after its first arrival
GATHER_CAP = 4


class Gathering:
    """First and latest arrival of a gathering batch."""

    def __init__(self, gap_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.gap_s, self._clock = gap_s, clock
        self._span: tuple[float, float] | None = None  # (first, latest) arrival

    def arrived(self, opens: bool) -> None:
        """A request joins the batch; ``opens``: it is the batch's first (the engine was
        idle), else it joins a gathering that is open, if any."""
        if self.gap_s <= 0 or (self._span is None and not opens):
            return
        now = self._clock()
        self._span = (now if self._span is None else self._span[0], now)

    def left_s(self) -> float:
        """Seconds the batch still waits (0: start it, or nothing gathers)."""
        if self._span is None:
            return 0.0
        first, latest = self._span
        due = min(latest + self.gap_s, first + GATHER_CAP * self.gap_s)
        return max(0.0, due - self._clock())

    def end(self) -> None:
        """The batch started (or its requests left): nothing gathers."""
        self._span = None


def gap_option(options: Mapping[str, Any], name: str, default_ms: float) -> float:
    """A stage option of milliseconds to gather for, in seconds (0: start at once)."""
    return number_option(options, name, default_ms, float, 0) / 1000
