"""How many jobs share a transformer call: batch while it pays, measured per shape.

Step-level batching puts the rows of many requests in one transformer call. That pays while
one request's rows leave the device idle (a 2 B video transformer made 2x the steps/s with
4 videos a call on an H100). Once one request's rows fill the device, batching buys nothing
and delays every request in the call (32 B and 2 x 14 B transformers gained 2.5 % and 0 %
with 4 requests a call, and all four finished when the last did; bench/results/README.md
indexes the runs). What fills the device depends on the model, the request's shape and the
GPU, so no fixed row count is right: the engine measures its own calls instead.

RowPolicy keeps the device time of recent calls per (group key, rows), the fastest of the
last few (a call's first run of a shape pays one-off costs; a busy neighbour only slows
one down). Given the jobs that could share the next call, oldest first, it runs:
- the oldest alone while a lone call of its key has not been timed twice;
- all of them while a call of that many rows has not been timed twice (exploring), unless
  a larger call of the key was timed and did not pay;
- else the largest prefix whose measured throughput (rows per second) beats the lone call's
  by ``min_gain`` (default 10 %), or the oldest alone when none does: requests then run one
  after another in arrival order, and each finishes as early as the device allows (every
  RECHECK_EVERY-th such call is shared once more, to time it again).
``min_gain`` 0 turns the measuring off: every call takes all it can (up to max_batch_rows).
Sizes that run after the choice keep being timed; a size not chosen keeps its old times.

Requests that share every call finish in the same step and share one decode call (the
engine decodes equal latent shapes together), and a decode of several requests can pay
where their transformer call does not: on the dev VM a tiny image fixture at 512x512 gained
7 % from 4 rows a transformer call but 25 % from 4 images a VAE decode. So when the
candidates at the head of the queue are at the same step (a burst), the engine also says
which of them would finish together (``Finish``), and a prefix of those pays if its rows per
second with the decode's time spread over the steps left, ``rows / (call + decode / steps
left)``, beat the lone request's the same way by ``min_gain``. A decode of that many
requests not yet timed twice (with the lone decode timed) is explored by sharing them to the
end, unless a decode of more of them was already timed. Where the candidates are at
different steps they finish apart whatever runs, and only the transformer counts.

Device time: CUDA events around the call, read when they have completed (never waiting on
the device); on the CPU, the wall time of the call (it is synchronous).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger("omni.engine.diffusion")

DEFAULT_MIN_GAIN = 0.10
KEPT = 8  # times kept per (key, rows)
TIMED = 2  # times needed before a size counts as measured
RECHECK_EVERY = 256  # calls run alone before one is shared again, to re-time it
MAX_SIZES = 256  # (key, rows) pairs kept: a server sees as many shapes as clients ask for


@dataclass(frozen=True)
class Finish:
    """The head of the queue that would finish in one step, sharing every call from here:
    ``rows`` are the cumulative decode rows (images) of its first 1, 2, ... jobs, all at the
    oldest's step and of one latent shape (``key``); ``steps_left`` the oldest's steps."""

    key: Any
    steps_left: int
    rows: tuple[int, ...]


class RowPolicy:
    """The row cap of the next call per group key, from timed calls (module docstring)."""

    def __init__(self, min_gain: float, device: Any = None) -> None:
        self.min_gain = float(min_gain)
        self.cuda = torch.device(device).type == "cuda" if device is not None else False
        self._times: dict[tuple[Any, int], deque[float]] = {}
        self._pending: list[tuple[Any, int, Any, Any]] = []  # key, rows, start, end events
        self._sharing: dict[Any, bool] = {}  # the last choice per key, logged when it turns
        self._alone: dict[Any, int] = {}  # calls run alone since the last shared one

    @property
    def measuring(self) -> bool:
        return self.min_gain > 0

    def jobs_to_run(self, key: Any, sizes: list[int], finish: Finish | None = None) -> int:
        """How many of the candidate jobs run: ``sizes`` are the cumulative rows of the
        first 1, 2, ... jobs, oldest first (the caller already cut them at max_batch_rows);
        ``finish``: those of them that would finish together (module docstring)."""
        if not self.measuring or len(sizes) == 1:
            return len(sizes)
        self._harvest()
        lone = self.seconds(key, sizes[0])
        if lone is None:
            return 1
        if self.seconds(key, sizes[-1]) is None and not self._larger_fails(key, sizes[-1], lone,
                                                                         sizes[0]):
            return len(sizes)
        finish = finish if finish is not None and len(finish.rows) > 1 else None
        best = 1
        for count, rows in enumerate(sizes[1:], start=2):
            if self._pays(key, rows, lone, sizes[0]) or self._pays_decoded(
                    key, sizes, count, lone, finish):
                best = count
        if finish is not None and best < len(finish.rows) and self._explores_decode(finish):
            return len(finish.rows)
        self._tell(key, sizes, best, lone, finish)
        return self._recheck(key, best, len(sizes))

    def _pays_decoded(self, key: Any, sizes: list[int], count: int, lone: float,
                      finish: Finish | None) -> bool:
        """The first ``count`` jobs finish together: their shared call and shared decode
        (spread over the steps left) against the lone job's call and decode."""
        if finish is None or count > len(finish.rows):
            return False
        took = self.seconds(key, sizes[count - 1])
        decoded = self.seconds(_decode_key(finish.key), finish.rows[count - 1])
        lone_decoded = self.seconds(_decode_key(finish.key), finish.rows[0])
        if took is None or decoded is None or lone_decoded is None:
            return False
        steps = max(1, finish.steps_left)
        return (sizes[count - 1] / (took + decoded / steps)
                >= (1 + self.min_gain) * sizes[0] / (lone + lone_decoded / steps))

    def _explores_decode(self, finish: Finish) -> bool:
        """Whether to share the jobs that finish together to the end, to time their decode:
        the lone decode is timed, theirs is not, and no decode of more rows was timed."""
        key, rows = _decode_key(finish.key), finish.rows[-1]
        if self.seconds(key, finish.rows[0]) is None or self.seconds(key, rows) is not None:
            return False
        return not self._timed_above(key, rows)

    def stop_decode(self, timer: Any, key: Any, rows: int) -> None:
        """The decode that ``timer`` started decoded ``rows`` images of latent shape ``key``."""
        self.stop(timer, _decode_key(key), rows)

    def _recheck(self, key: Any, best: int, count: int) -> int:
        """Every RECHECK_EVERY-th call that could have been shared and was not, share it
        once: its time joins the kept ones, so a size first timed while something else
        slowed the device gets another chance."""
        key = _hashable(key)
        if best > 1:
            self._alone.pop(key, None)
            return best
        self._alone[key] = self._alone.get(key, 0) + 1
        while len(self._alone) > MAX_SIZES:
            del self._alone[next(iter(self._alone))]
        if self._alone.get(key, 0) < RECHECK_EVERY:
            return best
        self._alone.pop(key, None)
        return count

    def _tell(self, key: Any, sizes: list[int], best: int, lone: float,
              finish: Finish | None = None) -> None:
        """Log when a shape's choice turns between sharing calls and one at a time, with
        the times it rests on (the operator's answer to "why are my requests queued?")."""
        key = _hashable(key)
        sharing = best > 1
        if self._sharing.get(key) == sharing:
            return
        self._sharing[key] = sharing
        while len(self._sharing) > MAX_SIZES:
            del self._sharing[next(iter(self._sharing))]
        rows = sizes[best - 1] if sharing else sizes[-1]
        took = self.seconds(key, rows)
        measured = "" if took is None else (
            f"; {rows} rows in {took * 1e3:.1f} ms = {rows / took:.1f} rows/s")
        log.info("shape %s: %s (a lone call of %d rows in %.1f ms = %.1f rows/s%s%s; "
                 "batch_gain %.2f)", key, "requests share calls" if sharing
                 else "one request at a time", sizes[0], lone * 1e3, sizes[0] / lone,
                 measured, self._told_decode(finish), self.min_gain)

    def _told_decode(self, finish: Finish | None) -> str:
        """The decode times a choice also rests on, for the log line."""
        if finish is None:
            return ""
        key = _decode_key(finish.key)
        lone, shared = self.seconds(key, finish.rows[0]), self.seconds(key, finish.rows[-1])
        if lone is None or shared is None:
            return ""
        return (f"; decodes of {finish.rows[0]} and {finish.rows[-1]} images in "
                f"{lone * 1e3:.1f} and {shared * 1e3:.1f} ms over {finish.steps_left} steps")

    def _pays(self, key: Any, rows: int, lone: float, lone_rows: int) -> bool:
        took = self.seconds(key, rows)
        return took is not None and rows / took >= (1 + self.min_gain) * lone_rows / lone

    def _larger_fails(self, key: Any, rows: int, lone: float, lone_rows: int) -> bool:
        """A measured call of more rows did not pay: fewer are not explored (a call's
        throughput does not fall as it grows)."""
        return any(not self._pays(key, r, lone, lone_rows) for r in self._timed_above(key, rows))

    def _timed_above(self, key: Any, rows: int) -> list[int]:
        """The row counts above ``rows`` timed (twice) for ``key``."""
        key = _hashable(key)
        return [r for (k, r), t in self._times.items() if k == key and r > rows and len(t) >= TIMED]

    def seconds(self, key: Any, rows: int) -> float | None:
        """The fastest kept time of a call of ``rows`` rows of ``key``, once timed twice."""
        times = self._times.get((_hashable(key), rows))
        return min(times) if times is not None and len(times) >= TIMED else None

    def start(self) -> Any:
        """A timer for the call (transformer or decode) about to run (None when not
        measuring)."""
        if not self.measuring:
            return None
        if self.cuda:
            begin = torch.cuda.Event(enable_timing=True)
            begin.record()
            return begin
        return time.perf_counter()

    def stop(self, timer: Any, key: Any, rows: int) -> None:
        """The call that ``timer`` started ran ``rows`` rows of ``key``."""
        if timer is None or rows <= 0:
            return
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((_hashable(key), rows, timer, end))
            if len(self._pending) > 16:  # a lone request's calls are never asked about
                self._harvest()
            return
        self.record(key, rows, time.perf_counter() - timer)

    def record(self, key: Any, rows: int, seconds: float) -> None:
        """One call of ``rows`` rows of ``key`` took ``seconds`` on the device."""
        key = _hashable(key)
        times = self._times.pop((key, rows), None) or deque(maxlen=KEPT)
        times.append(seconds)
        self._times[(key, rows)] = times  # last used last: the oldest go first
        while len(self._times) > MAX_SIZES:
            del self._times[next(iter(self._times))]

    def _harvest(self) -> None:
        """Completed CUDA timings into the kept times (events still running wait)."""
        still = []
        for key, rows, begin, end in self._pending:
            if end.query():
                self.record(key, rows, begin.elapsed_time(end) / 1e3)
            else:
                still.append((key, rows, begin, end))
        self._pending = still[-64:]  # bounded if the device never catches up


def _decode_key(key: Any) -> Any:
    return ("decode", _hashable(key))


def _hashable(key: Any) -> Any:
    try:
        hash(key)
    except TypeError:
        return repr(key)
    return key
