"""The order of the AR engine's work inside one step() call (StepRunner, which engine.py's
AREngine holds): overlapped steps and chained decode steps (options overlap_steps and
chain_decode).

Without overlap, a call schedules a step, runs its forward, samples (waiting for the GPU),
records the tokens and builds the outputs. With overlap (on by default on CUDA), a call
first samples the step the previous call launched, records its tokens, schedules and
launches the next step, and only then detokenizes and builds the outputs of the first:
the engine loop publishes them while the GPU computes. On an H200 (an 8B dense shape) that
host work was 0.5 ms of a 6.3 ms decode step at batch 1 and 1.1 ms of 7.6 ms at batch 32;
overlap took the batch-32 step from 7.75 to 7.29 ms (bench/results/ar-step-*.md). A
request that a stop string ends while its next row already runs loses that row only.
When the next step would feed prompt tokens, the call returns its outputs first and the
next call launches it: an eager prefill can hold the host as long as the GPU runs it.

Chained decode (chain_decode, on by default on CUDA; needs overlap):
when the launched step was a one-token-per-row step of plain greedy rows (no penalties,
logprobs, min_tokens left, media or hidden-state export) and nobody else is running or
waiting, the next call launches the following step BEFORE reading the tokens: each row is
fed the token the device picked (argmax; the copy to the host is queued right behind it,
with an event), so scheduling and filling the next step also overlap the GPU. Then it
waits for that copy only. A row whose request ended with the token it was fed is dropped.
On the H200 (8B dense shape, bench.ar_step) the step went from 7.51 (overlap alone) to
6.49 ms at batch 32 and 6.39 to 5.94 ms at batch 1: the GPU's own replay of the same
graph takes 6.47 and 5.93 ms, so the host no longer holds it back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol

import torch

from omni.engines.ar.kv_cache import OutOfBlocksError, PagedKVCache
from omni.engines.ar.sampling import Sampled, plain_greedy, sample
from omni.engines.ar.scheduler import ScheduledBatch, Scheduler, Sequence
from omni.engines.ar.state import Flight
from omni.engines.base import StepOutput

log = logging.getLogger("omni.engines.ar.engine")

SLOW_STEP_S = 0.5  # a step this long, and SLOW_STEP_FACTOR times the usual, is logged
SLOW_STEP_FACTOR = 10.0


class StepHost(Protocol):
    """What a StepRunner needs of its engine (engine.py): the scheduler and KV cache it
    steps over, the forward pass, and what becomes of a sequence and its sampled tokens."""

    scheduler: Scheduler
    cache: PagedKVCache

    def _forward(self, batch: ScheduledBatch, fed: torch.Tensor | None = None
                 ) -> tuple[list[Sequence], torch.Tensor, Any]: ...
    def _before_launch(self) -> None: ...
    def _stop_ids(self) -> set[int]: ...
    def _sampled(self, seqs: list[Sequence], results: list[Any]) -> None: ...
    def _record(self, seq: Sequence, token: int) -> None: ...
    def _emit(self, seq: Sequence, result: Any) -> StepOutput: ...
    def _finish(self, seq: Sequence, reason: str, text: str | None) -> StepOutput: ...
    def _fail(self, seq: Sequence, error: str) -> StepOutput: ...


class StepRunner:
    """Runs the AR engine's steps in the order above: launches each step, collects its
    tokens (a call later, with overlap), chains greedy decode steps; holds the step in
    flight and the step counters."""

    def __init__(self, engine: StepHost, seqs: Mapping[str, Sequence], *, overlap: bool,
                 chain: bool, exports_decode_rows: bool) -> None:
        self.engine = engine
        self.seqs = seqs  # the engine's live requests: a sequence not here has ended
        self.overlap = overlap
        self.chain = chain
        # a chained step exports no hidden states, so an engine that exports a decode
        # step's rows (export_hidden_layers, not prompt-only) never chains
        self.exports_decode_rows = exports_decode_rows
        self.inflight: Flight | None = None  # launched by the last step(), not sampled
        self.steps = 0
        self.chained_steps = 0  # steps launched by _chain
        self.step_time_s = 0.0
        self._usual_step_s = 0.0  # see _timed

    def step(self, outputs: list[StepOutput]) -> list[StepOutput]:
        """One step() call's work; `outputs` (already due: failed requests) go first."""
        engine = self.engine
        flight, self.inflight = self.inflight, None
        chained = self._chain(flight) if flight is not None else None
        ready = self._collect(flight, outputs) if flight is not None else []
        if chained is not None:
            self._settle(chained)
            self.inflight = chained
        elif ready and self.overlap and self._prompt_next():
            pass  # these outputs go out first; the next call launches (see _prompt_next)
        else:
            engine._before_launch()
            self.inflight = self._launch(outputs)
            if not self.overlap and self.inflight is not None:
                flight, self.inflight = self.inflight, None
                ready += self._collect(flight, outputs)
        for seq, result in ready:  # with overlap, while the GPU runs the step just launched
            try:
                outputs.append(engine._emit(seq, result))
            except Exception as e:  # e.g. its detokenizer failed: only it fails
                outputs.append(engine._fail(seq, f"{type(e).__name__}: {e}"))
        return outputs

    def _launch(self, outputs: list[StepOutput]) -> Flight | None:
        """Schedule the next step and start its forward (on CUDA the host does not wait)."""
        engine = self.engine
        batch = engine.scheduler.schedule()
        for seq in batch.overflowed:
            outputs.append(engine._finish(seq, "length", None))
        if not batch.seqs:
            return None
        started = time.perf_counter()
        try:
            sampled, logits, hidden = engine._forward(batch)
            engine.scheduler.finish_step(batch)
        except Exception as e:  # the whole step failed: fail its requests, keep the rest
            for seq in batch.seqs:
                outputs.append(engine._fail(seq, f"{type(e).__name__}: {e}"))
            return None
        flight = Flight(batch.seqs, hidden, sampled, logits, started, tokens=sum(batch.counts))
        if self._chainable(batch, sampled):
            _pick_on_device(flight)
        return flight

    def _chainable(self, batch: ScheduledBatch, sampled: list[Sequence]) -> bool:
        return (self.chain and self.overlap and not self.exports_decode_rows
                and len(sampled) == len(batch.seqs) and all(n == 1 for n in batch.counts)
                and all(s.media is None and plain_greedy(s.state.sampler) for s in sampled))

    def _chain(self, flight: Flight) -> Flight | None:
        """Launch the flight's next decode step on the tokens its device picked, or None
        when that cannot be done safely (then the call schedules as usual)."""
        seqs, engine = flight.seqs, self.engine
        if (flight.next_ids is None or engine.scheduler.waiting
                or len(engine.scheduler.running) != len(seqs)
                or not all(self._alive(s) for s in seqs)
                or any(s.limit is not None and len(s.output) + 2 > s.limit for s in seqs)):
            return None  # (a limit: the flight's token and the chained one must both fit)
        try:  # the fed token's KV slot: position computed (the picked token's)
            for seq in seqs:
                engine.cache.grow(seq.blocks, seq.computed + 1)
        except OutOfBlocksError:
            return None  # the scheduler decides whom to preempt
        batch = ScheduledBatch(list(seqs), [1] * len(seqs), [s.computed for s in seqs], [], [])
        started = time.perf_counter()
        try:
            sampled, logits, _ = engine._forward(batch, fed=flight.next_ids)
        except Exception as e:  # the usual launch runs it again and fails its requests properly
            log.warning("chained decode step failed (%s: %s); launching it the usual way",
                        type(e).__name__, e)
            return None
        chained = Flight(batch.seqs, None, sampled, logits, started, settle=batch,
                         tokens=len(batch.seqs))
        _pick_on_device(chained)  # plain greedy rows stay plain greedy
        self.chained_steps += 1
        return chained

    def _settle(self, flight: Flight) -> None:
        """The chained step's tokens are known now (recorded by _collect): its rows count
        as computed, except those whose request ended meanwhile."""
        batch = flight.settle
        live = [s for s in batch.seqs if self._alive(s) and s.state.finish is None]
        self.engine.scheduler.finish_step(ScheduledBatch(live, [1] * len(live),
                                                         [s.computed for s in live], [], []))

    def _collect(self, flight: Flight, outputs: list[StepOutput]) -> list[tuple[Sequence, Any]]:
        """Sample the launched step (waits for its forward) and record the tokens, so the
        next schedule sees them. Rows of requests that ended meanwhile (aborted, or stopped
        by a stop string at the previous emit) are dropped: their KV blocks are already
        free, and nothing can reuse them before this sync."""
        engine = self.engine
        try:
            if flight.host_ids is not None:  # picked on the device at launch
                if flight.event is not None:
                    flight.event.synchronize()
                results = [Sampled(t) for t in flight.host_ids.tolist()]
            else:
                results = sample(flight.logits.float(), [s.state.sampler for s in flight.sampled],
                                 engine._stop_ids()) if flight.sampled else []
        except Exception as e:
            outputs += [engine._fail(s, f"{type(e).__name__}: {e}") for s in flight.seqs
                        if self._alive(s)]
            return []
        for seq, rows in zip(flight.seqs, flight.hidden or [], strict=False):
            if rows is not None and self._alive(seq):
                seq.state.hidden = (seq.state.hidden or []) + [rows]
        ready = [(s, r) for s, r in zip(flight.sampled, results, strict=True) if self._alive(s)]
        engine._sampled([s for s, _ in ready], [r for _, r in ready])
        for seq, result in ready:
            engine._record(seq, result.token)
        self.steps += 1
        self._timed(flight, time.perf_counter() - flight.started)
        return ready

    def _timed(self, flight: Flight, took_s: float) -> None:
        """Count the step's time; say so when one step took far longer than the usual
        ones: a first-use cost on the request path (a kernel compiled for a new shape, a
        graph captured late) shows up here as a stall of every running request. CUDA only:
        on a CPU a long prompt's step is legitimately hundreds of decode steps long."""
        self.step_time_s += took_s
        usual = self._usual_step_s
        if usual and flight.logits.is_cuda and took_s > max(SLOW_STEP_S, SLOW_STEP_FACTOR * usual):
            log.warning("slow step: %.0f ms for %d rows, %d tokens (usual %.1f ms); every "
                        "running request waited for it", took_s * 1e3, len(flight.seqs),
                        flight.tokens, usual * 1e3)
        # the usual step: an exponential average that one outlier barely moves
        self._usual_step_s = took_s if not usual else 0.95 * usual + 0.05 * min(took_s, 4 * usual)

    def _prompt_next(self) -> bool:
        """Whether the next step feeds prompt tokens (a request waits with a free row, or
        a prompt chunk is left). Its eager forward can hold the host for as long as the
        GPU takes (a data-dependent MoE routing syncs), so overlapping it would hold back
        the outputs in hand, often first tokens, by a whole prefill step: they are
        published first."""
        sched = self.engine.scheduler
        return ((bool(sched.waiting) and len(sched.running) < sched.max_num_seqs)
                or any(s.pending > 1 for s in sched.running))

    def _alive(self, seq: Sequence) -> bool:
        return self.seqs.get(seq.id) is seq


def _pick_on_device(flight: Flight) -> None:
    """Greedy tokens of the flight's rows, on its device (what sample() would pick), and
    their copy to the host queued behind them."""
    ids = flight.logits.float().argmax(dim=-1)
    flight.next_ids, flight.host_ids = ids, ids
    if ids.is_cuda:
        flight.host_ids = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
        flight.host_ids.copy_(ids, non_blocking=True)
        flight.event = torch.cuda.Event()
        flight.event.record()
