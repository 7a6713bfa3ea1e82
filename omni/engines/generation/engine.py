"""Generation engine: batched non-autoregressive tensor-in/tensor-out execution.

The engine knows nothing about any model: a *runner* (built by a model adapter in
omni/models/) turns one request's input value into a (rows, frames) tensor and runs a batch
of equal-length inputs. Requests take their frames either complete in add() or as a stream
of append() chunks; the engine cuts them into chunks of new frames with left context,
batches the chunks that are ready across requests, and streams one output per chunk.

Inputs (add): {runner.input_key: value} (complete), {"stream": [producer]} (frames come
through append(request_id, producer, seq, {runner.input_key: value}, last)), or, from a
full-delivery edge, {producer: [{runner.input_key: value}, ...]}.

Chunking: a request is ready with a chunk's worth of new frames (first_chunk_frames, times
runner.chunk_growth per chunk up to chunk_frames, so a player is not left waiting for a
full-size second chunk) or when its input is complete and frames remain. A chunk is its next
n new frames plus up to left_context earlier ones (their output dropped). Complete inputs
use complete_chunk_frames. Streams emit one chunk per step. ``"context"`` frames beside an
input value (a clone's reference codes; causal decoders) are left context only (request.py).

Batching: one runner call per step over ready chunks of one total (context + new) length (no
padding: outputs equal unbatched runs), those whose clients run out of audio first
(deadlines as in items mode below), up to max_batch_size rows and max_batch_frames frames;
each call's audio leaves at once and new input is taken between calls.

Items mode (a runner with ``items = True``, e.g. TTS): the runner splits each input into
opaque units (``split(value, params)``, e.g. sentences), each one output with no context;
streamed text goes to ``split_stream(text, params, final) -> (units, held)`` when the runner
has it (ended sentences out, the rest held); inputs the runner names in ``side_inputs`` (a
voice-clone reference) join the request's params. Each step makes one ``run_items(units,
params)`` call for the request whose client runs out of media first (deadline: its arrival
until its first output, then that output's time + the seconds of media sent, from
``samples`` / ``sample_rate``), with other ready requests of the same ``group_key(params)``
in deadline order up to max_batch_size (alone when the runner says ``batches_units =
False``); a runner with ``streams_units`` starts such a call and advances it over the next
steps instead (partial outputs, streamed_items.py); with ``join_items`` the next units of
other requests join that running call between steps (continuous batching) instead of
waiting for its end. Short steps let new requests join and
outputs leave between units; a new request's first unit goes first unless a started one is
within two calls of running dry: over capacity, clients queue for their first audio instead
of all stuttering.

Outputs, one per chunk: runner.pack(wav) fields (audio: "audio", "sample_rate", "samples") +
"frames" (new frames) + "index" (0, 1, ...); finished=True on the last chunk once all input
is in, or on a closing output when a stream ends after its last chunk went out: the engine's
own, only "frames" (0) and "index" (no runner fields: consumers of audio skip an output
without "samples").

A stage's engine is built in build.py (this one, or streams.py's for a runner that keeps
per-request state); inputs become a request's frames or units in intake.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import torch

from omni.engines.base import (
    ENGINE_FAULT,
    INPUT_FAULT,
    Engine,
    EngineLoadError,
    EngineRequest,
    StepOutput,
)
from omni.engines.gather import Gathering, gap_option
from omni.engines.generation.intake import RequestIntake
from omni.engines.generation.memory import (
    longest_row,
    reserve_peak,
    stage_batch_frames,
    trim_cache,
)
from omni.engines.generation.request import (
    GenRequest,
    Runner,
    media_seconds,
    next_chunk,
    started_running_dry,
)
from omni.engines.generation.streamed_items import StreamedItems

log = logging.getLogger("omni.engines.generation")
SLOW_STEP_S, SLOW_STEP_FACTOR = 0.25, 4.0  # a streamed step this long and this many usual ones


class GenerationEngine(Engine):
    """Cross-request batched, chunked execution of a runner (see module docstring).

    options: max_batch_size (64): the most chunks in one runner call; max_batch_frames
    (0 = no limit): the most rows x frames in one call; by default sized from the stage's
    memory budget on a GPU (generation/memory.py), else the runner's `batch_frames`;
    gather_ms (0): requests that find the engine idle wait until none has come for this
    long, so a burst that arrives spread out runs in one call (omni/engines/gather/).
    A runner lists the options it reads in its OPTIONS.
    """

    OPTIONS = frozenset({"max_batch_size", "max_batch_frames", "gather_ms"})
    memory_advice = ("a call's activations are sized from the budget at load when "
                     "max_batch_frames is not set: unset it or lower it")

    def __init__(self, runner: Runner, options: Mapping[str, Any] | None = None,
                 memory_bytes: int | None = None) -> None:
        opts = dict(options or {})
        self.runner = runner
        # items mode: inputs are not frames but units the runner splits them into (e.g.
        # sentences for TTS); each unit is one output, and requests batch by group_key
        self.items = bool(getattr(runner, "items", False))
        self.batches_units = bool(getattr(runner, "batches_units", True))
        self.intake = RequestIntake(runner, self.items)  # inputs -> a request's frames/units
        self._call_s: float | None = None  # items mode: running mean of one runner call
        self.max_batch_size = int(opts.get("max_batch_size", 64))
        self.memory_bytes = memory_bytes  # the stage's budget (checked again at READY)
        self.cache_trims = 0
        # _trim_above: a sized budget, kept after each call
        self.max_batch_frames, self._trim_above = stage_batch_frames(
            runner, opts, memory_bytes, self.max_batch_size)
        if self.max_batch_size < 1 or self.max_batch_frames < 0:
            raise EngineLoadError("max_batch_size must be >= 1 and max_batch_frames >= 0 (0: no "
                                  f"limit), got {self.max_batch_size} and {self.max_batch_frames}")
        # a runner may prepare its calls for these limits (warm its call shapes up); that
        # cuts the cache up, so the sized peak is reserved again after it
        prepare = getattr(runner, "prepare_calls", None)
        warmed = prepare is not None and prepare(self.max_batch_size, self.max_batch_frames)
        if warmed and self._trim_above is not None:
            reserve_peak(runner, self.max_batch_frames, self.longest_row)
        self._reqs: dict[str, GenRequest] = {}
        self._gathering = Gathering(gap_option(opts, "gather_ms", 0))
        self._job: StreamedItems | None = None  # a streamed items call in progress
        self._failed: list[StepOutput] = []
        self.calls = self.requests_run = self.max_batch = 0

    @property
    def longest_row(self) -> int:
        """The most frames one row of a call can hold: the largest chunk and its context."""
        return longest_row(self.runner)

    # -- contract ---------------------------------------------------------------------
    def add(self, request: EngineRequest) -> None:
        rid = request.request_id
        try:
            if rid in self._reqs:
                raise ValueError(f"request id {rid!r} is already running")
            self._gathering.arrived(opens=not self._reqs and self._job is None)
            self._reqs[rid] = self.intake.new_request(rid, request.inputs or {},
                                                      dict(request.params or {}))
        except (ValueError, TypeError) as e:  # the request's own input: a 400, not a 500
            self._fail(rid, f"bad input: {e}", INPUT_FAULT)

    def append(self, request_id: str, producer: str, seq: int, data: dict[str, Any] | None,
               last: bool) -> None:
        req = self._reqs.get(request_id)
        if req is None:
            return  # aborted or already failed: late chunks in flight are dropped
        if producer not in req.open:
            self._fail(request_id, f"unexpected stream input from '{producer}' (" + (
                f"expected {sorted(req.open)})" if req.open else
                "the request takes no stream input now)"))
            return
        want = req.open[producer]
        if seq != want:
            kind = "duplicate" if isinstance(seq, int) and seq < want else "out-of-order"
            self._fail(request_id, f"{kind} chunk from '{producer}': seq {seq}, expected {want}")
            return
        try:
            self.intake.take_chunk(req, data, last)
        except (ValueError, TypeError) as e:
            self._fail(request_id, f"bad stream chunk {seq} from '{producer}': {e}")
            return
        req.open[producer] = want + 1
        if last:
            del req.open[producer]
            req.complete = not req.open

    def abort(self, request_ids: list[str]) -> None:
        ids = set(request_ids)
        for rid in ids:
            self._reqs.pop(rid, None)
        if not self._reqs:
            self._gathering.end()
        self._failed = [o for o in self._failed if o.request_id not in ids]

    def has_work(self) -> bool:
        return (bool(self._failed) or self._job is not None
                or any(self._plan(r) is not None for r in self._reqs.values()))

    def gather_s(self) -> float:
        return 0.0 if self._failed or self._job is not None else self._gathering.left_s()

    def step(self) -> list[StepOutput]:
        self._gathering.end()  # a caller that steps has nothing more to add meanwhile
        if self.items:
            return self._step_items()
        outputs, self._failed = self._failed, []
        groups: dict[int, list[tuple[GenRequest, int, int]]] = {}
        for req in list(self._reqs.values()):
            plan = self._plan(req)
            if plan is None:
                continue
            ctx, n = plan
            if n == 0:  # input ended right after the last chunk: close the request
                outputs.append(self._output(req, None, 0))
                continue
            groups.setdefault(ctx + n, []).append((req, ctx, n))
        if groups:  # one call per step, for the most urgent chunk (earliest deadline)
            for group in groups.values():
                group.sort(key=lambda item: item[0].deadline())
            key = min(groups, key=lambda k: groups[k][0][0].deadline())
            rows = self.max_batch_size
            if self.max_batch_frames:
                rows = max(1, min(rows, self.max_batch_frames // key))
            outputs += self._run(groups[key][:rows])
        return outputs

    def _step_items(self) -> list[StepOutput]:
        outputs, self._failed = self._failed, []
        job = self._job
        if job is not None and not job.joins:
            return outputs + self._advance()
        busy = job.requests if job is not None else set()
        ready = []
        for req in list(self._reqs.values()):
            plan = None if req.id in busy else self._plan(req)
            if plan is None:
                continue
            if plan[1] == 0:  # stream input ended right after its last unit: close it
                outputs.append(self._output(req, None, 0))
            else:
                ready.append(req)
        group = self._pick(ready, job)
        if not group and job is None:
            return outputs
        started = time.perf_counter()
        streamed = job is not None or getattr(self.runner, "streams_units", False)
        if job is not None:  # continuous batching: the next units join the running call
            outputs += self._join(group) + self._advance()
        elif streamed:
            outputs += self._start(group)
        else:
            outputs += self._run([(req, 0, 1) for req in group])
        took = time.perf_counter() - started
        if streamed:
            self._check_step(took, len(group))
        self._call_s = took if self._call_s is None else 0.8 * self._call_s + 0.2 * took
        return outputs

    def _check_step(self, took_s: float, joined: int) -> None:
        """Say so when a streamed call's step took far longer than the usual ones: every
        running request's audio waited for it (a first use of a shape, a join's prefill).
        CUDA only, as the AR engine's (steps.py): a CPU step's length varies legitimately."""
        usual = self._call_s
        if usual and str(getattr(self.runner, "device", "cpu")).startswith("cuda") \
                and took_s > max(SLOW_STEP_S, SLOW_STEP_FACTOR * usual):
            rows = len(self._job.rows) if self._job is not None else 0
            log.warning("slow step: %.0f ms with %d rows running, %d joining (usual %.1f ms); "
                        "every running request waited for it", took_s * 1e3, rows, joined,
                        usual * 1e3)

    def _pick(self, ready: list[GenRequest], job: StreamedItems | None) -> list[GenRequest]:
        """The ready requests whose next unit runs now: the earliest deadline's group key
        (a running call's own), in deadline order, up to the room left."""
        if not ready:
            return []
        hold_new = started_running_dry(self._reqs.values(), self._call_s)
        ready.sort(key=lambda r: (hold_new and r.play_start is None, r.deadline()))
        key = job.key if job is not None else self.runner.group_key(ready[0].params)
        limit = self.max_batch_size if self.batches_units else 1
        room = limit - (len(job.rows) if job is not None else 0)
        return [r for r in ready if self.runner.group_key(r.params) == key][:max(0, room)]

    def _start(self, group: list[GenRequest]) -> list[StepOutput]:
        """A streamed items call: started, then advanced once (the first audio soonest)."""
        self._count_call(len(group))
        try:
            self._job = StreamedItems(self.runner, group)
        except Exception as e:
            return self._fail_group(group, e)
        return self._advance()

    def _join(self, group: list[GenRequest]) -> list[StepOutput]:
        """Units that join the running call (it stays up if their prefill fails)."""
        if not group:
            return []
        try:
            self._job.join(group)
        except Exception as e:
            return self._fail_group(group, e)
        self.calls += 1
        self.requests_run += len(group)
        self.max_batch = max(self.max_batch, len(self._job.rows))
        return []

    def _advance(self) -> list[StepOutput]:
        job, self._job = self._job, None
        try:
            rows = job.advance(self._reqs)
        except Exception as e:
            return self._fail_group(list(job.rows.values()), e)
        self._job = None if job.done else job
        return [self._output(req, result, n) for req, result, n in rows]

    def _count_call(self, rows: int) -> None:
        self.calls += 1
        self.requests_run += rows
        self.max_batch = max(self.max_batch, rows)

    def _fail_group(self, group: list[GenRequest], e: Exception) -> list[StepOutput]:
        """The whole call failed: fail its requests, keep the rest."""
        for req in group:
            self._reqs.pop(req.id, None)
        return [StepOutput(req.id, finished=True, error=f"{type(e).__name__}: {e}")
                for req in group]

    def info(self) -> dict[str, Any]:
        return {"engine": "generation", **self.runner.info(),
                "max_batch_size": self.max_batch_size, "max_batch_frames": self.max_batch_frames}

    def stats(self) -> dict[str, Any]:
        return {"running": len(self._reqs), "calls": self.calls,
                "requests_run": self.requests_run, "max_batch": self.max_batch,
                "cache_trims": self.cache_trims,
                "buffered_frames": sum(r.total - r.base for r in self._reqs.values())}

    def shutdown(self) -> None:
        self._job = None
        self._reqs.clear()
        self._failed.clear()

    # -- internals --------------------------------------------------------------------
    def _plan(self, req: GenRequest) -> tuple[int, int] | None:
        """(context frames, new frames) of the request's next chunk; None when not ready."""
        if self.items:  # one unit per output, no context
            new = req.total - req.done
            return (0, 1) if new else ((0, 0) if req.complete else None)
        return next_chunk(req, self.runner)

    def _run(self, group: list[tuple[GenRequest, int, int]]) -> list[StepOutput]:
        self._count_call(len(group))
        try:
            results = self._call_runner(group)
        except Exception as e:
            return self._fail_group([req for req, _, _ in group], e)
        finally:  # after a failed call too: an out-of-memory one leaves the cache cut up
            if self._trim_above is not None:
                self.cache_trims += trim_cache(self.runner.device, self._trim_above)
        return [self._output(req, wav, n) for (req, _, n), wav in zip(group, results, strict=True)]

    def _call_runner(self, group: list[tuple[GenRequest, int, int]]) -> list[torch.Tensor]:
        if self.items:
            units = [req.units[req.done] for req, _, _ in group]
            for req, _, _ in group:
                req.units[req.done] = None  # its output is about to go out: free it
            return self.runner.run_items(units, [req.params for req, _, _ in group])
        batch = torch.stack([self._window(req, ctx, n) for req, ctx, n in group])
        return self.runner.run(batch, [ctx for _, ctx, _ in group])

    def _window(self, req: GenRequest, ctx: int, n: int) -> torch.Tensor:
        frames = req.frames()
        start = req.done - ctx - req.base
        return frames[:, start:start + ctx + n]

    def _output(self, req: GenRequest, result: Any, n: int) -> StepOutput:
        """One output of the request; result None: its closing output (the input ended
        right after its last chunk), which has no model output, so no runner fields."""
        try:
            packed = {} if result is None else self.runner.pack(result)
        except Exception as e:  # noqa: BLE001 - a runner's bug fails its request, not the replica
            log.exception("request %s: %s.pack failed", req.id, type(self.runner).__name__)
            self._reqs.pop(req.id, None)
            return StepOutput(req.id, finished=True, error=f"packing its output failed: "
                              f"{type(e).__name__}: {e}", error_kind=ENGINE_FAULT)
        data = {**packed, "frames": n, "index": req.index}
        if n or data.get("samples"):
            req.play_start = time.monotonic() if req.play_start is None else req.play_start
            req.played_s += media_seconds(data)
        req.done += n
        req.index += 1
        finished = req.complete and req.done == req.total
        if finished:
            self._reqs.pop(req.id, None)
        elif not self.items:  # keep only what the next chunk can use as context
            req.trim(max(0, req.done - self.runner.left_context))
        return StepOutput(req.id, data=data, finished=finished)

    def _fail(self, rid: str, msg: str, kind: str = ENGINE_FAULT) -> None:
        self._reqs.pop(rid, None)
        self._failed = [o for o in self._failed if o.request_id != rid]
        self._failed.append(StepOutput(rid, finished=True, error=msg, error_kind=kind))

