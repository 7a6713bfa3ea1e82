"""Policy engine: robot observations -> action chunks, batched across robots.

The engine knows no model: a *policy* adapter (omni/models/) splits flow
matching into a prefix pass (images + prompt + state -> a cache) and a per-step
forward (the velocity at (x_t, t) given that cache). The engine owns the loop, as the
diffusion engine owns denoising:

- admission: each engine step runs the prefix pass for up to ``max_admit_per_step``
  waiting observations, those of equal ``prefix_key`` (camera count, prompt length) in one
  call, up to ``max_batch`` each; a bad observation fails alone at ``add``.
- one flow-matching step per engine step: the running jobs of the oldest job's
  ``step_key`` (equal prefix length) share ONE forward call, up to ``max_batch`` robots,
  each at its own timestep; the engine takes the Euler step x += dt * v (t from 1 to 0,
  dt = -1 / steps, as the model's own ``sample_actions``). A policy family with another
  schedule or integrator gives ``timestep(job)`` / ``advance(job, velocity)`` itself. Robots that arrive while
  others are mid-chunk join at the next step: nobody waits for a chunk to finish.
- finish: a job after its last step leaves with ``actions`` (horizon, width) in robot
  units (the adapter cuts and un-normalises them).

Sessions (a robot's connection, the ``session`` param): the engine keeps each one's
episode record (calls so far, the last chunk) and reports its bytes; `end_session` drops
it. Seeds: the ``seed`` param, or a random one (reported in the output).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from omni.engines.base import (
    Engine,
    EngineLoadError,
    EngineRequest,
    Policy,
    PolicyJob,
    StepOutput,
    check_options,
    failed_output,
)

if TYPE_CHECKING:
    from omni.engines.proc import EngineSpec

log = logging.getLogger("omni.engine.policy")

MAX_STEPS = 100


@dataclass
class Episode:
    """What the engine keeps for one robot's session between calls."""

    calls: int = 0
    last_actions: torch.Tensor | None = None

    def nbytes(self) -> int:
        t = self.last_actions
        return 64 + (0 if t is None else t.numel() * t.element_size())


def request_seed(params: Mapping[str, Any]) -> int:
    seed = params.get("seed")
    if seed is None:
        return secrets.randbits(63)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"'seed' must be an integer from 0 to 2**63 - 1, got {seed!r}")
    return seed


def request_steps(params: Mapping[str, Any]) -> int | None:
    steps = params.get("steps")
    if steps is None:
        return None
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"'steps' must be an integer from 1 to {MAX_STEPS}, got {steps!r}")
    return steps


def euler_timestep(job: PolicyJob) -> float:
    """Flow matching from t = 1 to 0 in equal steps, in π0's own arithmetic
    (sample_actions: t = 1 + step * dt), so the result matches it bit for bit."""
    return 1.0 + job.step * (-1.0 / job.steps)


def euler_advance(job: PolicyJob, velocity: torch.Tensor) -> torch.Tensor:
    """x_{t+dt} = x_t + dt * v (dt = -1 / steps)."""
    return job.actions + (-1.0 / job.steps) * velocity


class PolicyEngine(Engine):
    """Flow-matching steps batched across robots (see the module docstring).

    options: max_batch (32): the most robots in one forward call;
    max_admit_per_step (8): prefix passes per engine step.
    """

    OPTIONS = frozenset({"max_batch", "max_admit_per_step"})

    def __init__(self, policy: Policy, options: Mapping[str, Any] | None = None) -> None:
        opts = dict(options or {})
        self.policy = policy
        self.max_batch = int(opts.get("max_batch", 32))
        self.max_admit = int(opts.get("max_admit_per_step", 8))
        if self.max_batch < 1 or self.max_admit < 1:
            raise EngineLoadError("max_batch and max_admit_per_step must be >= 1")
        self._waiting: dict[str, PolicyJob] = {}
        self._jobs: dict[str, PolicyJob] = {}
        self._out: list[StepOutput] = []
        self._episodes: dict[str, Episode] = {}
        self.prefix_calls = self.step_calls = self.rows_run = self.max_rows = 0
        self.chunks = 0

    # -- contract ---------------------------------------------------------------------
    def add(self, request: EngineRequest) -> None:
        rid = request.request_id
        try:
            if rid in self._waiting or rid in self._jobs:
                raise ValueError(f"request id {rid!r} is already running")
            params = dict(request.params or {})
            started = time.monotonic()
            with torch.inference_mode():
                job = self.policy.prepare(rid, request.inputs or {}, request_seed(params),
                                          request_steps(params))
            job.prepare_ms = round((time.monotonic() - started) * 1000, 3)
        except Exception as e:  # noqa: BLE001 - a bad observation fails alone
            if not isinstance(e, ValueError | TypeError):
                log.exception("request %s: preparing the observation failed", rid)
            self._out.append(failed_output(rid, e))
            return
        session = params.get("session")
        job.session = session if isinstance(session, str) else None
        self._waiting[rid] = job

    def abort(self, request_ids: list[str]) -> None:
        ids = set(request_ids)
        for rid in ids:
            self._waiting.pop(rid, None)
            self._jobs.pop(rid, None)  # its cache goes with it
        self._out = [o for o in self._out if o.request_id not in ids]
        self._release_if_idle()

    def has_work(self) -> bool:
        return bool(self._out or self._waiting or self._jobs)

    def step(self) -> list[StepOutput]:
        # inference mode, not just no_grad: no version counters or view tracking on any
        # tensor a step makes; at batch 1 the tiny π0 on one CPU core is bound by per-op
        # overhead, and a chunk took 13.7 instead of 15.4 ms (p50, 150 chunks)
        with torch.inference_mode():
            return self._step()

    def _step(self) -> list[StepOutput]:
        self._admit()
        batch = self._next_batch()
        if batch:
            self._flow_step(batch)
        for job in [j for j in self._jobs.values() if j.step >= j.steps]:
            self._finish(job)
        self._release_if_idle()
        outputs, self._out = self._out, []
        return outputs

    def _release_if_idle(self) -> None:
        """Nobody is stepping: the adapter frees what it kept across steps (a batch's
        concatenated cache), so no buffer outlives the robots it was built for."""
        idle = getattr(self.policy, "idle", None)
        if not self._jobs and idle is not None:
            idle()

    def end_session(self, session: str, op: str) -> bool:
        return self._episodes.pop(session, None) is not None

    def info(self) -> dict[str, Any]:
        info = {"output": "actions", **self.policy.info(), "max_batch": self.max_batch}
        if hasattr(self.policy, "device"):
            info.setdefault("device", str(self.policy.device))
        return info

    def stats(self) -> dict[str, Any]:
        return {"waiting": len(self._waiting), "running": len(self._jobs),
                "tensor_bytes": sum(j.tensor_bytes() for j in self._jobs.values()),
                "prefix_calls": self.prefix_calls, "step_calls": self.step_calls,
                "rows_run": self.rows_run, "max_rows": self.max_rows,
                "chunks": self.chunks,
                "session_bytes": {sid: e.nbytes() for sid, e in self._episodes.items()}}

    # -- phases -------------------------------------------------------------------------
    def _admit(self) -> None:
        """Prefix passes for up to max_admit waiting jobs, oldest first, grouped."""
        groups: dict[Any, list[PolicyJob]] = {}
        for job in list(self._waiting.values())[:self.max_admit]:
            group = groups.setdefault(job.prefix_key, [])
            if len(group) < self.max_batch:
                group.append(job)
        for jobs in groups.values():
            for job in jobs:
                del self._waiting[job.request_id]
            try:
                self.policy.prefix(jobs)
            except Exception as e:  # noqa: BLE001 - these observations fail, others go on
                log.exception("prefix pass failed for %s", [j.request_id for j in jobs])
                self._fail(jobs, f"prefix pass failed: {type(e).__name__}: {e}")
                continue
            self.prefix_calls += 1
            now = time.monotonic()
            for job in jobs:
                job.started = now
                job.inputs = {}  # the prefix holds what the steps need
                self._jobs[job.request_id] = job

    def _next_batch(self) -> list[PolicyJob]:
        pending = sorted((j for j in self._jobs.values() if j.step < j.steps),
                         key=lambda j: j.arrival)
        if not pending:
            return []
        key = pending[0].step_key
        return [j for j in pending if j.step_key == key][:self.max_batch]

    def _flow_step(self, batch: list[PolicyJob]) -> None:
        actions = torch.cat([j.actions for j in batch])
        timestep = getattr(self.policy, "timestep", euler_timestep)
        timesteps = torch.tensor([timestep(j) for j in batch], dtype=torch.float32,
                                 device=actions.device)
        try:
            velocity = self.policy.velocity(batch, actions, timesteps)
        except Exception as e:  # noqa: BLE001
            log.exception("policy step failed for %s", [j.request_id for j in batch])
            self._fail(batch, f"policy step failed: {type(e).__name__}: {e}")
            return
        self.step_calls += 1
        self.rows_run += len(batch)
        self.max_rows = max(self.max_rows, len(batch))
        advance = getattr(self.policy, "advance", euler_advance)
        for i, job in enumerate(batch):
            job.actions = advance(job, velocity[i:i + 1])
            job.step += 1

    def _finish(self, job: PolicyJob) -> None:
        del self._jobs[job.request_id]
        try:
            data = self.policy.finish(job)
        except Exception as e:  # noqa: BLE001
            log.exception("request %s: finishing the chunk failed", job.request_id)
            self._fail([job], f"finishing the chunk failed: {type(e).__name__}: {e}")
            return
        self.chunks += 1
        data.update(seed=job.seed, steps=job.steps,
                    policy_ms=round((time.monotonic() - job.arrival) * 1000, 3),
                    prepare_ms=job.prepare_ms)
        if job.session is not None:
            episode = self._episodes.setdefault(job.session, Episode())
            episode.calls += 1
            episode.last_actions = data["actions"]
            data["episode_step"] = episode.calls
        self._out.append(StepOutput(job.request_id, data, finished=True))

    def _fail(self, jobs: list[PolicyJob], message: str) -> None:
        for job in jobs:
            self._jobs.pop(job.request_id, None)
            self._out.append(StepOutput(job.request_id, finished=True, error=message))


def stage_engine(spec: EngineSpec) -> PolicyEngine:
    """The engine of a policy stage (omni/engines/kinds.py)."""
    from omni.engines.base import resolve_device

    return build_policy_engine(spec.model, model_dir=spec.model_dir,
                               device=resolve_device(spec.device), dtype=spec.dtype,
                               options=spec.options)


def build_policy_engine(model: str, *, model_dir: str | None, device: str, dtype: str,
                        options: Mapping[str, Any]) -> PolicyEngine:
    """The policy engine for a stage's `model` (adapters: omni/models/__init__.py)."""
    from omni.models import adapter_options, build_policy

    check_options(f"policy engine ({model})", options,
                  PolicyEngine.OPTIONS | adapter_options(model))
    policy = build_policy(model, model_dir=model_dir, device=device, dtype=dtype,
                          options=options)
    return PolicyEngine(policy, options)
