"""Diffusion engine: one denoising step is the unit of scheduling.

The engine knows no model: a *denoiser* (built by an adapter in omni/models/) turns a
request into a `DenoiseJob` (text encoded, latents drawn from the request's seed, a
per-request copy of the directory's own scheduler with its timesteps), predicts the
guided model output for a list of jobs in ONE transformer call, and decodes a finished
job's latents into pixels. The engine owns the loop:

- admission: new requests are encoded (text encoder, reference images) at the start of
  the next step, up to ``max_admit_per_step`` per step, oldest first, and join the
  running set; a bad request fails alone.
- one denoising step per engine step: the running jobs are grouped by the denoiser's
  ``group_key`` (shapes that can share a call); the group holding the oldest job runs,
  its jobs in arrival order up to ``max_batch_rows`` transformer rows (classifier-free
  guidance rows count: a guided job of n images is 2n rows). Every job in the call is at
  its own timestep. Then each job's scheduler takes its step.
- decode: jobs whose last step ran are decoded (VAE) in the same engine step, those of
  equal latent shape together (up to ``max_batch_rows``), and leave with their pixels;
  abort drops a job at once (between steps), freeing its tensors.
- progress: every stepped job emits {"progress": {"step": i, "steps": n}}; a request
  with param ``previews`` = k (0-3) also gets k evenly spaced previews (the denoiser's
  ``preview``: its current estimate of the final pixels) as {"preview": ..., "index": i}.

Step cache (stage option or per-request param ``step_cache``: a threshold, ``true`` for
DEFAULT_STEP_CACHE, 0 / ``false`` = off, the default): before a job's
step the engine adds the relative L1 change of its latents since the previous step to a
running sum; while that sum stays below the threshold the job reuses its last model
output instead of joining the transformer call (the first and last steps always run).
This is the TeaCache idea with the latents as the change indicator, a cheaper and
model-agnostic stand-in for TeaCache's timestep-modulated input; its quality cost is
the model's and the threshold's, so outputs report how many steps were skipped. On the
tiny fixtures at 20 steps the default skips about half (bench/results/diffusion.md).

Outputs: progress chunks while denoising, then one finished chunk with the denoiser's
decoded fields (e.g. "images": uint8 (n, H, W, 3) or "video": uint8 (F, H, W, 3), which
travel through the connector) plus "seed", "steps", "skipped_steps".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from omni.engines.base import (
    ENGINE_FAULT,
    INPUT_FAULT,
    DenoiseJob,
    Denoiser,
    Engine,
    EngineLoadError,
    EngineRequest,
    StepOutput,
    check_options,
)
from omni.engines.diffusion.quantize import quantize_denoiser
from omni.engines.diffusion.rows import DEFAULT_MIN_GAIN, Finish, RowPolicy

if TYPE_CHECKING:
    from omni.engines.proc import EngineSpec

log = logging.getLogger("omni.engine.diffusion")


MAX_PREVIEWS = 3
DEFAULT_STEP_CACHE = 0.04  # relative L1 change summed over skipped steps


def cache_threshold(value: Any) -> float:
    """``step_cache`` as given (bool or a number >= 0) -> the threshold; ValueError."""
    if value is True:
        return DEFAULT_STEP_CACHE
    if value is None or value is False:
        return 0.0
    if isinstance(value, int | float) and 0 <= value <= 10:
        return float(value)
    raise ValueError(f"'step_cache' must be true, false or a threshold from 0 to 10, "
                     f"got {value!r}")


def preview_steps(previews: int, steps: int) -> tuple[int, ...]:
    """After which steps k evenly spaced previews go out (never after the last step)."""
    return tuple(sorted({round(steps * (i + 1) / (previews + 1)) for i in range(previews)}
                        - {0, steps}))


class DiffusionEngine(Engine):
    """Step-level scheduling of denoising across requests (see module docstring).

    options: max_batch_rows (16): the most transformer rows in one call;
    batch_gain (0.1): the throughput gain over a lone call that a shared call must show in
    this engine's own timed calls of that shape, else requests run one after another
    (rows.py; 0: always share, up to max_batch_rows);
    max_admit_per_step (8): requests encoded per step;
    step_cache (off): the default step-cache threshold (see the module docstring);
    quantization (none): fp8 stores the transformer blocks' weights in e4m3 (quantize.py);
    load_format (auto): dummy builds the models with random weights from their configs,
    outputs are noise (omni/models/dummy_weights.py; the adapter's load reads it).
    A denoiser lists the options it reads in its OPTIONS.
    """

    OPTIONS = frozenset({"max_batch_rows", "max_admit_per_step", "step_cache", "quantization",
                         "batch_gain", "load_format"})

    def __init__(self, denoiser: Denoiser, options: Mapping[str, Any] | None = None) -> None:
        opts = dict(options or {})
        self.denoiser = denoiser
        self.max_batch_rows = int(opts.get("max_batch_rows", 16))
        self.max_admit = int(opts.get("max_admit_per_step", 8))
        if self.max_batch_rows < 1 or self.max_admit < 1:
            raise EngineLoadError("max_batch_rows and max_admit_per_step must be >= 1")
        gain = opts.get("batch_gain", DEFAULT_MIN_GAIN)
        if isinstance(gain, bool) or not isinstance(gain, int | float) or not 0 <= gain <= 10:
            raise EngineLoadError(f"batch_gain must be a number from 0 to 10, got {gain!r}")
        self.rows = RowPolicy(gain, getattr(denoiser, "device", None))
        try:
            self.step_cache = cache_threshold(opts.get("step_cache"))
        except ValueError as e:
            raise EngineLoadError(str(e)) from e
        self.quantized = quantize_denoiser(denoiser, opts.get("quantization"))
        # READY and the stage's card say so: its outputs are noise (the adapter loaded it)
        self.random_weights = ({"load_format": "dummy"} if opts.get("load_format") == "dummy"
                               else {})
        # id -> (plan, previews, cache threshold, arrival), not yet encoded
        self._waiting: dict[str, tuple[Any, int, float, float]] = {}
        self._jobs: dict[str, DenoiseJob] = {}
        self._failed: list[StepOutput] = []
        self.calls = 0
        self.rows_run = 0
        self.steps_skipped = 0
        self.max_rows = 0

    # -- contract ---------------------------------------------------------------------
    def add(self, request: EngineRequest) -> None:
        rid = request.request_id
        try:
            if rid in self._waiting or rid in self._jobs:
                raise ValueError(f"request id {rid!r} is already running")
            params = dict(request.params or {})
            previews = params.get("previews", 0)
            if previews and not hasattr(self.denoiser, "preview"):
                raise ValueError("this model cannot stream previews")
            if not isinstance(previews, int) or not 0 <= previews <= MAX_PREVIEWS:
                raise ValueError(f"'previews' must be an integer from 0 to {MAX_PREVIEWS}")
            threshold = cache_threshold(params.get("step_cache", self.step_cache))
            self._waiting[rid] = (self.denoiser.plan(request.inputs or {}, params), previews,
                                  threshold, time.monotonic())
        except (ValueError, TypeError) as e:
            self._fail(rid, f"bad input: {e}", INPUT_FAULT)

    def abort(self, request_ids: list[str]) -> None:
        ids = set(request_ids)
        for rid in ids:
            self._waiting.pop(rid, None)
            self._jobs.pop(rid, None)  # its tensors go with it
        self._failed = [o for o in self._failed if o.request_id not in ids]

    def has_work(self) -> bool:
        return bool(self._failed or self._waiting or self._jobs)

    def step(self) -> list[StepOutput]:
        outputs, self._failed = self._failed, []
        self._admit()
        batch = self._next_batch()
        if batch:
            outputs += self._denoise(batch)
        outputs += self._finish([j for j in self._jobs.values() if j.step >= j.steps])
        outputs += self._failed  # failures found during this step
        self._failed = []
        return outputs

    def end_session(self, session: str, op: str) -> bool:
        """World sessions (a denoiser that keeps per-session state, e.g. cosmos3_world)."""
        end = getattr(self.denoiser, "end_session", None)
        return bool(end(session, op)) if end is not None else False

    def largest_output_bytes(self) -> int:
        limits = getattr(self.denoiser, "limits", None)
        return limits.largest_output_bytes() if limits is not None else 0

    def info(self) -> dict[str, Any]:
        info = {"output": self.denoiser.output, **self.denoiser.info(),
                "max_batch_rows": self.max_batch_rows, "step_cache": self.step_cache,
                "batch_gain": self.rows.min_gain, **self.quantized, **self.random_weights}
        if hasattr(self.denoiser, "device"):  # where it runs, for the READY log line
            info.setdefault("device", str(self.denoiser.device))
        return info

    def stats(self) -> dict[str, Any]:
        return {"waiting": len(self._waiting), "running": len(self._jobs),
                "tensor_bytes": sum(j.tensor_bytes() for j in self._jobs.values()),
                "transformer_calls": self.calls, "rows_run": self.rows_run,
                "steps_skipped": self.steps_skipped, "max_rows": self.max_rows,
                **({"session_bytes": self.denoiser.session_bytes()}
                   if hasattr(self.denoiser, "session_bytes") else {})}

    # -- phases -------------------------------------------------------------------------
    def _admit(self) -> None:
        """Encode up to max_admit waiting requests, oldest first; each joins the running
        set. The cap keeps one step's encoding bounded when a burst arrives, so running
        requests keep stepping."""
        for rid in list(self._waiting)[:self.max_admit]:
            plan, previews, threshold, arrival = self._waiting.pop(rid)
            try:
                job = self.denoiser.start(rid, plan)
                job.preview_steps = preview_steps(previews, job.steps)
                job.cache_threshold, job.arrival = threshold, arrival
            except (ValueError, TypeError) as e:
                self._fail(rid, f"bad input: {e}", INPUT_FAULT)
                continue
            except Exception as e:  # a model failure on this input: fail it alone
                log.exception("request %s: encoding failed", rid)
                self._fail(rid, f"encoding failed: {type(e).__name__}: {e}")
                continue
            job.started = time.monotonic()
            self._jobs[rid] = job

    def _next_batch(self) -> list[DenoiseJob]:
        """The group holding the oldest unfinished job, oldest first, up to the row cap
        and as many as sharing the call pays for (rows.py)."""
        pending = sorted((j for j in self._jobs.values() if j.step < j.steps),
                         key=lambda j: j.arrival)
        if not pending:
            return []
        key = self.denoiser.group_key(pending[0])
        batch, rows = [], 0
        for job in pending:
            if self.denoiser.group_key(job) != key:
                continue
            if batch and rows + job.model_rows > self.max_batch_rows:
                break
            batch.append(job)
            rows += job.model_rows
        sizes = list(accumulate(j.model_rows for j in batch))
        finish = _finish_together(batch) if self.rows.measuring and len(batch) > 1 else None
        return batch[:self.rows.jobs_to_run(key, sizes, finish)]

    def _denoise(self, batch: list[DenoiseJob]) -> list[StepOutput]:
        run = [job for job in batch if not self._reuses_output(job)]
        if run:
            rows, timer = sum(j.model_rows for j in run), self.rows.start()
            try:
                predictions = self.denoiser.predict(run)
                self.rows.stop(timer, self.denoiser.group_key(run[0]), rows)
            except Exception as e:
                log.exception("transformer call failed for %s", [j.request_id for j in run])
                for job in run:
                    self._jobs.pop(job.request_id, None)
                    self._fail(job.request_id, f"denoising failed: {type(e).__name__}: {e}")
                batch = [j for j in batch if j not in run]
                run, predictions, rows = [], [], 0
            self.calls += 1 if run else 0
            self.rows_run += rows
            self.max_rows = max(self.max_rows, rows)
            for job, prediction in zip(run, predictions, strict=True):
                job.last_output, job.change_since_run = prediction, 0.0
        outputs = []
        for job in batch:
            t = job.timesteps[job.step]
            job.prev_latents = job.latents if job.cache_threshold > 0 else None
            job.latents = job.scheduler.step(job.last_output, t, job.latents,
                                             return_dict=False)[0]
            job.step += 1
            if job.step < job.steps:
                outputs.append(self._progress(job))
        return outputs

    def _progress(self, job: DenoiseJob) -> StepOutput:
        data: dict[str, Any] = {"progress": {"step": job.step, "steps": job.steps}}
        if job.step in job.preview_steps:
            try:
                data.update(self.denoiser.preview(job),  # type: ignore[attr-defined]
                            index=job.preview_steps.index(job.step))
            except Exception:  # a preview is a nicety: the request goes on without it
                log.exception("request %s: preview failed", job.request_id)
        return StepOutput(job.request_id, data)

    def _reuses_output(self, job: DenoiseJob) -> bool:
        """Step cache: skip the model for this job's step (see module docstring)."""
        if (job.cache_threshold <= 0 or job.last_output is None or job.prev_latents is None
                or job.step >= job.steps - 1):
            return False
        prev = job.prev_latents
        change = float((job.latents - prev).abs().mean() / prev.abs().mean().clamp_min(1e-12))
        job.change_since_run += change
        if job.change_since_run < job.cache_threshold:
            job.skipped += 1
            self.steps_skipped += 1
            return True
        return False

    def _finish(self, done: list[DenoiseJob]) -> list[StepOutput]:
        """Decode finished jobs, equal latent shapes in one call each, and release them."""
        groups: dict[tuple, list[list[DenoiseJob]]] = {}
        for job in done:
            self._jobs.pop(job.request_id, None)
            chunks = groups.setdefault(tuple(job.latents.shape[1:]), [[]])
            if sum(j.rows for j in chunks[-1]) + job.rows > self.max_batch_rows:
                chunks.append([])
            chunks[-1].append(job)
        outputs = []
        for shape, jobs in ((s, c) for s, chunks in groups.items() for c in chunks if c):
            try:
                timer = self.rows.start()
                decoded = self.denoiser.decode(jobs)
                self.rows.stop_decode(timer, shape, sum(j.rows for j in jobs))
            except Exception as e:
                log.exception("decode failed for %s", [j.request_id for j in jobs])
                outputs += [StepOutput(j.request_id, finished=True, error=(
                    f"decoding failed: {type(e).__name__}: {e}")) for j in jobs]
                continue
            for job, data in zip(jobs, decoded, strict=True):
                data.update(seed=job.seed, steps=job.steps, skipped_steps=job.skipped,
                            denoise_s=round(time.monotonic() - job.started, 4))
                outputs.append(StepOutput(job.request_id, data, finished=True))
        return outputs

    def _fail(self, request_id: str, message: str, kind: str = ENGINE_FAULT) -> None:
        """``kind``: INPUT_FAULT for what the client must fix (the API answers 400)."""
        self._failed.append(StepOutput(request_id, finished=True, error=message,
                                       error_kind=kind))


def _finish_together(batch: list[DenoiseJob]) -> Finish:
    """The head of ``batch`` (oldest first) that would finish and decode with its oldest
    job, sharing every call from here: at its step, of its latent shape (rows.py)."""
    first = batch[0]
    left, shape = first.steps - first.step, tuple(first.latents.shape[1:])
    rows = []
    for job in batch:
        if job.steps - job.step != left or tuple(job.latents.shape[1:]) != shape:
            break
        rows.append((rows[-1] if rows else 0) + job.rows)
    return Finish(shape, left, tuple(rows))


def stage_engine(spec: EngineSpec) -> DiffusionEngine:
    """The engine of a diffusion stage (omni/engines/kinds.py)."""
    from omni.engines.base import resolve_device

    return build_diffusion_engine(spec.model, model_dir=spec.model_dir,
                                  device=resolve_device(spec.device), dtype=spec.dtype,
                                  options=spec.options)


def build_diffusion_engine(model: str, *, model_dir: str | None, device: str, dtype: str,
                           options: Mapping[str, Any]) -> DiffusionEngine:
    """The diffusion engine for a stage's `model` (adapters: omni/models/__init__.py)."""
    from omni.models import adapter_options, build_denoiser

    check_options(f"diffusion engine ({model})", options,
                  DiffusionEngine.OPTIONS | adapter_options(model))
    denoiser = build_denoiser(model, model_dir=model_dir, device=device, dtype=dtype,
                              options=options)
    return DiffusionEngine(denoiser, options)
