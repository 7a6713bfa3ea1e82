"""A generation stage's memory budget on a GPU: how many frames one runner call may take.

The AR engine's budget sizes its KV cache; a frame runner (e.g. a codec decoder) keeps no
cache, and what grows with load is one call's activations: a vocoder's last layers hold
thousands of samples x channels per frame. Without a bound, 32 complete answers in one
call took a codec-decoder stage from ~1 GiB to 13.9 GiB on a shared H200 and ran the
other stages out of memory (bench/results/archive/server-full-h200-c32-code2wav-oom.log).

So with `memory:` set on a CUDA stage, the engine measures at load instead of guessing:
- weights: what the process holds once the runner is loaded;
- what the caching allocator reserves at the peak of a call, with one and with two rows
  of the longest row a call can hold (`GenerationEngine.longest_row`): reserved, not allocated, because blocks
  are cut from segments and a freed block does not always fit the next request (on the
  H200 a call sized from allocated bytes reserved 11.1 GiB against a 7 GiB budget). So
  peak(f) = fixed + per_frame * f for f frames in rows of that length (linear in rows;
  rows of the longest length carry the most of any per-row attention term);
- max_batch_frames = (budget - weights - fixed) * HEADROOM / per_frame (at most what
  max_batch_size rows of the longest length hold), then one call of that size is run,
  and cut down if it reserved more than the budget (warm-up: the peak is reserved at
  load, so the READY report's memory is what serving will hold, and a budget that does
  not fit fails here, not in a request);
- after each call in serving, a stage holding more than its budget (calls of other
  shapes fragment the cache differently) gives its cached blocks back (`trim_cache`).
On CPU there is nothing to measure (no allocator statistics, and the host's RAM is not
what runs short): the runner's default stands.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from omni.engines.base import EngineLoadError

log = logging.getLogger(__name__)

GiB = 2 ** 30
# a tenth of the room left free: serving's calls have other shapes than the probes (many
# short streamed rows, a last short row) and cut the cache's segments differently
HEADROOM = 0.9


def longest_row(runner: Any) -> int:
    """The most frames one row of a call can hold: the largest chunk and its context."""
    r = runner
    return max(r.first_chunk_frames, r.chunk_frames, r.complete_chunk_frames) + r.left_context


def stage_batch_frames(runner: Any, opts: Any, budget: int | None,
                       max_rows: int) -> tuple[int, int | None]:
    """A stage's max_batch_frames, and the budget to trim the cache to after each call
    (None: no trimming)."""
    if "max_batch_frames" in opts:  # the operator's number wins over a budget
        return int(opts["max_batch_frames"]), None
    if budget and str(getattr(runner, "device", "cpu")).startswith("cuda"):
        if hasattr(runner, "probe_batch"):
            row = longest_row(runner)
            return size_batch_frames(runner, budget, row, max_rows * row), budget
        log.warning("this runner cannot size its calls from a memory budget: the budget "
                    "is only compared with what the stage holds after loading")
    return int(getattr(runner, "batch_frames", 0)), None


def frames_for_budget(budget: int, weights: int, fixed: int, per_frame: float) -> int:
    """The most frames one call may take so that weights + its peak fit the budget."""
    room = (budget - weights - fixed) * HEADROOM
    return max(0, int(room // max(per_frame, 1.0)))


def _call_peak(runner: Any, device: torch.device, rows: int, row: int) -> int:
    """Bytes the caching allocator reserved at the peak of one call of `rows` rows of `row`
    frames, above what it held before (emptied first: what the call itself needs)."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved(device)
    torch.cuda.reset_peak_memory_stats(device)
    runner.run(runner.probe_batch(rows, row), [0] * rows)
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_reserved(device) - before


def _too_small(budget: int, weights: int, call: float, need: int) -> EngineLoadError:
    least = weights + call / HEADROOM
    return EngineLoadError(
        f"memory budget {budget / GiB:.2f} GiB is too small: the weights take "
        f"{weights / GiB:.2f} GiB and a call of its longest row ({need} frames) "
        f"{call / GiB:.2f} GiB more; give it at least {least / GiB:.2f} GiB, or shorten "
        "chunk_frames / complete_chunk_frames")


def size_batch_frames(runner: Any, budget: int, need: int, most: int) -> int:
    """max_batch_frames (at most `most`) for `runner` within `budget` bytes on its CUDA
    device (see the module doc), rows being at most `need` frames long; EngineLoadError
    when not even one such row fits."""
    device = torch.device(runner.device)
    torch.cuda.empty_cache()
    weights = torch.cuda.memory_reserved(device)
    one, two = (_call_peak(runner, device, rows, need) for rows in (1, 2))
    # the second row's bytes; at least half the first call's (a small model's call can be
    # all fixed cost, and the allocator's rounding can hide a row)
    per_frame = max((two - one) / need, one / need / 2, 1.0)
    fixed = max(0, int(one - per_frame * need))
    frames = min(most, frames_for_budget(budget, weights, fixed, per_frame))
    for _ in range(3):  # the warm-up; a call that reserves more than measured is cut down
        if frames < need:
            raise _too_small(budget, weights, one, need)
        peak = weights + _call_peak(runner, device, frames // need, need)
        if peak <= budget:
            break
        frames = int(frames * (budget - weights) / (peak - weights) * HEADROOM)
    else:
        raise _too_small(budget, weights, one, need)
    log.info("memory budget %.2f GiB: weights %.2f GiB, %.2f MiB per frame of a call: "
             "up to %d frames a call (reserved after the warm-up call: %.2f GiB)",
             budget / GiB, weights / GiB, per_frame / 2 ** 20, frames,
             torch.cuda.memory_reserved(device) / GiB)
    return frames


def reserve_peak(runner: Any, frames: int, row: int) -> None:
    """The cache emptied, then the largest call made again: what the stage holds is that
    call's peak, as size_batch_frames left it, after other calls (a runner's warm-up of its
    call shapes) cut the cache up."""
    torch.cuda.empty_cache()
    rows = max(1, frames // row)
    runner.run(runner.probe_batch(rows, row), [0] * rows)
    log.info("reserved after the warm-up calls: %.2f GiB",
             torch.cuda.memory_reserved(torch.device(runner.device)) / GiB)


def trim_cache(device: Any, budget: int) -> bool:
    """After a call: give cached blocks back when the stage holds more than its budget
    (calls of other shapes than the warm-up's can fragment the cache past it). True when
    it did."""
    if torch.cuda.memory_reserved(device) <= budget:
        return False
    torch.cuda.empty_cache()
    return True
