"""Cosmos 3's ``policy`` mode (video and actions denoised jointly from the robot's camera
frame) as a second policy family for the policy engine, behind the same OpenPI endpoint
as π0.

The engine's contract fits without engine changes: ``prefix`` has nothing to cache (the
transformer re-reads the prompt every step), ``velocity`` is one packed transformer call
for every robot in the batch (cosmos3_batch.py) and returns the action velocities, while
the vision velocity waits in the job; ``timestep`` / ``advance`` are the pipeline's UniPC
schedule and steps (one scheduler copy for the video, one for the actions, as the
pipeline keeps them). The result equals ``Cosmos3OmniPipeline(..., action=
CosmosActionCondition(mode="policy", ...)).action`` for the same seed
(tests/unit/test_cosmos3_policy.py).

Observation: one camera is the conditioning frame (the first of the robot's key style,
policy_inputs.py; a style's other cameras and its state are accepted and not read, as the
metadata frame says), the prompt is the task; the embodiment domain is the stage option ``domain`` (or an
observation's ``domain`` string). Actions come back as the model predicts them
(``chunk_size`` x the domain's width), with no dataset statistics applied.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

import omni.models.diffusion as common
from omni.engines.base import EngineLoadError, PolicyJob
from omni.models.cosmos3_world import FPS, Cosmos3WorldDenoiser, _pil, build_cosmos3_world
from omni.models.policy_inputs import ObservationLayout, prompt_text
from omni.wire.arrays import unpack_tree

# the one camera it reads, under LeRobot's single-camera name (its "lerobot" key style)
FRAME_FEATURE = "observation.image"


class Cosmos3Policy:
    """options: domain (required unless observations carry one), chunk_size (4),
    steps (35), guidance_scale (1.0), resolution_tier (256), observation_keys (a key
    style) or cameras (the observation key of the frame first; policy_inputs.py)."""

    OPTIONS = frozenset({"domain", "chunk_size", "steps", "guidance_scale",
                         "resolution_tier", "observation_keys", "cameras", "default_prompt"})

    def __init__(self, world: Cosmos3WorldDenoiser, options: Mapping[str, Any]) -> None:
        self.world, self.pipe, self.device = world, world.pipe, world.device
        self.domain = options.get("domain")
        if self.domain is not None and self.domain not in world.domains:
            raise EngineLoadError(f"unknown domain {self.domain!r}; this model serves "
                                  f"{', '.join(sorted(world.domains))}")
        self.chunk = int(options.get("chunk_size", 4))
        self.steps = int(options.get("steps", 35))
        self.guidance = float(options.get("guidance_scale", 1.0))
        self.layout = ObservationLayout.declare(
            (FRAME_FEATURE,), None, options, other_keys=frozenset({"prompt", "domain"}),
            reads_state=False, spare_cameras=True)
        self.default_prompt = options.get("default_prompt")

    def info(self) -> dict[str, Any]:
        width = self.world.domains.get(self.domain) if self.domain else None
        return {"policy": "cosmos3", "horizon": self.chunk, "action_width": width,
                "cameras": list(self.layout.features), "inputs": self.layout.describe(),
                "domains": self.world.domains, "steps": self.steps, "fps": FPS}

    def prepare(self, request_id: str, inputs: Mapping[str, Any], seed: int,
                steps: int | None) -> PolicyJob:
        from diffusers import CosmosActionCondition

        obs = self.layout.read(unpack_tree(inputs.get("observation")))
        domain = obs.values.get("domain", self.domain)
        if not isinstance(domain, str) or domain not in self.world.domains:
            raise ValueError(f"unknown domain {domain!r} (set the stage option 'domain' or "
                             f"send one of {', '.join(sorted(self.world.domains))})")
        image = _pil(obs.cameras[0][1].permute(1, 2, 0).numpy())
        action = CosmosActionCondition(mode="policy", chunk_size=self.chunk, domain_name=domain,
                                       resolution_tier=self.world.tier, image=image)
        from omni.models.cosmos3_packing import packed_request

        state = packed_request(self.pipe, action, prompt_text(obs.values, self.default_prompt),
                               self.world.bins[str(self.world.tier)],
                               common.generator(seed), self.device, FPS)
        vision_scheduler = copy.deepcopy(self.pipe.scheduler)
        vision_scheduler.set_timesteps(steps or self.steps, device=self.device)
        state.update(scale=self.guidance, guided=self.guidance > 1,
                     vision_scheduler=vision_scheduler,
                     action_scheduler=copy.deepcopy(vision_scheduler))
        actions = state.pop("action_latents")
        return PolicyJob(request_id, {}, state=torch.zeros(0), actions=actions[None],
                         steps=len(vision_scheduler.timesteps), seed=seed, prefix_key=0,
                         extra=state)

    def prefix(self, jobs: list[PolicyJob]) -> None:
        for job in jobs:  # nothing to cache: the prompt is re-read every step
            job.step_key = tuple(job.actions.shape)

    def timestep(self, job: PolicyJob) -> float:
        return float(job.extra["vision_scheduler"].timesteps[job.step])

    @torch.inference_mode()
    def velocity(self, jobs: list[PolicyJob], actions: torch.Tensor,
                 timesteps: torch.Tensor) -> torch.Tensor:
        from omni.models.cosmos3_packing import velocities

        out = velocities(self.pipe, [_JobView(j) for j in jobs], self.world.attention,
                         self.world.dtype, self.device,
                         latents=lambda view: view.job.extra["latents"],
                         actions=lambda view: view.job.actions[0],
                         timestep=lambda view: view.job.extra["vision_scheduler"]
                         .timesteps[view.job.step].item())
        for job, (vision, _) in zip(jobs, out, strict=True):
            job.extra["v_vision"] = vision
        return torch.stack([action for _, action in out])

    @torch.inference_mode()
    def advance(self, job: PolicyJob, velocity: torch.Tensor) -> torch.Tensor:
        """The pipeline's step: the video's and the actions' schedulers each take theirs."""
        extra = job.extra
        t = extra["vision_scheduler"].timesteps[job.step]
        extra["latents"] = extra["vision_scheduler"].step(
            extra.pop("v_vision").unsqueeze(0), t, extra["latents"].unsqueeze(0),
            return_dict=False)[0].squeeze(0)
        actions = job.actions[0]
        mask = extra["action_mask"]
        if mask is not None and mask.sum() < mask.numel():
            actions = extra["action_scheduler"].step(
                velocity[0].unsqueeze(0), t, actions.unsqueeze(0),
                return_dict=False)[0].squeeze(0)
            if extra["raw_action_dim"] is not None:
                actions[:, extra["raw_action_dim"]:] = 0
        return actions[None]

    def finish(self, job: PolicyJob) -> dict[str, Any]:
        width = job.extra["raw_action_dim"]
        chunk = job.actions[0][:, :width] if width is not None else job.actions[0]
        return {"actions": chunk.float().cpu().contiguous()}


class _JobView:
    """A PolicyJob as cosmos3_packing.velocities reads a job: ``state`` and ``guided``."""

    def __init__(self, job: PolicyJob) -> None:
        self.job, self.state = job, job.extra
        self.guided = job.extra["guided"]


def build_cosmos3_policy(*, model_dir: str | None, device: str, dtype: str,
                         options: Mapping[str, Any]) -> Cosmos3Policy:
    if not model_dir:
        raise EngineLoadError("model 'cosmos3_policy' needs a model_dir (a Cosmos 3 release)")
    tier = {"resolution_tier": options["resolution_tier"]} \
        if "resolution_tier" in options else {}
    return Cosmos3Policy(build_cosmos3_world(model_dir=model_dir, device=device, dtype=dtype,
                                             options=tier), options)
