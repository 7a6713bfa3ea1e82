"""How many prompt tokens a step may carry while other sequences decode, from a measured
step-time model (issue #44: decode that never waits long behind a prefill).

Every running sequence gets at most one token per step, so a step that carries a long
prompt chunk holds every decoding stream for its whole length: with 8,192-token chunks of
8,000-token prompts, streams on an H100 waited 175-330 ms between tokens against ~26 ms
(bench/results/prefill-h100.md). The scheduler already caps the prompt tokens of a step
that has decodes in it (``prefill_beside_decodes``); this sizes that cap so such a step
stays under ``step_latency_ms`` (default 50 ms on CUDA), instead of leaving it at
max_batched_tokens.

At load, after the warm-up, a few eager prefill steps of different sizes are timed (the
same forward a real step runs) and a line ``ms = fixed + per_token * tokens`` is fitted
by least squares; the cap is the tokens that line allows within the target, rounded
down to whole KV blocks, between the smallest timed size and max_batched_tokens. Steps
with no decode in them keep max_batched_tokens, so a burst of prompts alone prefills at
full size.

Why a floor at the smallest timed size: below it the line is extrapolated, and a timing
disturbed by another process on the GPU fits a large fixed part. Seen on an H100: an
omni pipeline's text stage, loading beside its sibling stages (and a second server),
fitted 56.7 ms + 0.019 ms/token against 3.1 ms + 0.057 ms/token for the same model in the
other server (the omni pipeline's H100 report in bench/results/); the cap came out at 16 tokens,
and at c=8 the prompts waiting beside one decoding stream prefilled 16 tokens a step:
first tokens after 18 s p50 instead of 0.4 s.
For the same reason each size is timed in two passes (ascending, then descending) and
the fastest counts: a neighbour's burst rarely covers both.
An explicit ``prefill_beside_decodes`` wins; on CPU nothing is measured unless
``step_latency_ms`` is set (a CPU step is slow for any size: the cap would be tiny).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from omni.engines.ar.warm import borrow_blocks, give_back, prefill_forward

log = logging.getLogger("omni.engines.ar.step_budget")

DEFAULT_STEP_LATENCY_MS = 50.0
SAMPLE_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2)  # of max_batched_tokens: timed step sizes
REPEATS = 2  # per size and pass: the fastest of all counts (two loads on one H200 fitted 9
# and 28 ms fixed with 2 in one pass)


@dataclass(frozen=True)
class StepModel:
    """A prefill step's time as a line in its token count."""

    fixed_ms: float
    per_token_ms: float

    def tokens_within(self, ms: float) -> int:
        if ms <= self.fixed_ms:
            return 0
        if self.per_token_ms <= 0:  # no measurable cost per token: any size fits
            return 1 << 30
        return int((ms - self.fixed_ms) / self.per_token_ms)


def fit(samples: list[tuple[int, float]]) -> StepModel:
    """Least-squares line through (tokens, ms); neither term negative."""
    n = len(samples)
    mean_x = sum(x for x, _ in samples) / n
    mean_y = sum(y for _, y in samples) / n
    var = sum((x - mean_x) ** 2 for x, _ in samples)
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in samples) / var) if var else 0.0
    slope = max(slope, 0.0)
    return StepModel(max(mean_y - slope * mean_x, 0.0), slope)


def measure(engine: Any, sizes: list[int]) -> StepModel | None:
    """Time eager prefill steps of `sizes` tokens (one sequence each) on the engine's cache;
    None when the pool cannot lend the blocks of the largest."""
    best: dict[int, float] = {}
    for tokens in [*sizes, *reversed(sizes)]:  # two passes: see the module doc
        tables = borrow_blocks(engine.cache, [tokens])
        if tables is None:
            return None
        try:
            ms = min(_time_step(engine, tables, tokens) for _ in range(REPEATS))
        finally:
            give_back(engine.cache, tables)
        best[tokens] = min(ms, best.get(tokens, ms))
    return fit(sorted(best.items()))


def _time_step(engine: Any, tables: list[list[int]], tokens: int) -> float:
    cuda = engine.lm.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(engine.lm.device)
    started = time.perf_counter()
    prefill_forward(engine.lm, engine.cache, tables, [tokens], engine._warm_inputs)
    if cuda:
        torch.cuda.synchronize(engine.lm.device)
    return (time.perf_counter() - started) * 1e3


def size_prefill_budget(engine: Any) -> StepModel | None:
    """Set the scheduler's prefill_beside_decodes from a measured step model (see the
    module doc); returns the model, or None when nothing was measured."""
    options, scheduler = engine.options, engine.scheduler
    target = options.get("step_latency_ms",
                         DEFAULT_STEP_LATENCY_MS if engine.lm.device.type == "cuda" else None)
    if "prefill_beside_decodes" in options or not target:
        return None
    if isinstance(target, bool) or not isinstance(target, int | float) or target <= 0:
        from omni.engines.base import EngineLoadError

        raise EngineLoadError(f"option step_latency_ms must be a positive number, got {target!r}")
    most, block = scheduler.max_batched_tokens, engine.cache.block_size
    sizes = sorted({max(block, int(most * f)) for f in SAMPLE_FRACTIONS})
    model = measure(engine, sizes)
    if model is None:
        log.info("step model not measured: the KV cache cannot lend %d tokens' blocks", sizes[-1])
        return None
    tokens = model.tokens_within(float(target)) // block * block
    scheduler.prefill_beside_decodes = min(most, max(sizes[0], tokens))
    log.info("prefill step model: %.1f ms + %.4f ms/token; a step beside decodes carries at "
             "most %d prompt tokens (step_latency_ms %s)", model.fixed_ms, model.per_token_ms,
             scheduler.prefill_beside_decodes, target)
    if tokens < sizes[0]:
        log.warning("the step model allows only %d prompt tokens a step within step_latency_ms "
                    "%s; steps beside decodes carry %d (the smallest timed step), since fewer "
                    "would leave waiting prompts a few tokens a step. If another process was "
                    "using the GPU at load, the timing was disturbed; else raise "
                    "step_latency_ms or set prefill_beside_decodes", tokens, target, sizes[0])
    return model
