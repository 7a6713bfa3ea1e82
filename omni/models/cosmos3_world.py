"""Cosmos 3 (diffusers ``Cosmos3OmniPipeline``) as an action-conditioned world model for the
diffusion engine: world sessions whose every step rolls the video forward from actions.

A world session (the ``session`` param) keeps, inside this adapter, its first frame and
the last frame it produced. A step carries an action sequence ``(T, width)`` for the
session's embodiment domain and returns the next chunk of frames: the pipeline's
``forward_dynamics`` mode conditioned on the session's **last frame** (the conditioning
rule: chunk k+1 = forward_dynamics(first frame of the session if k = 0, else the last
frame of chunk k as uint8 RGB; the session's prompt and domain; the step's actions and
seed)). The first step after opening or a reset carries the first frame. ``reset``
returns to the first frame; ``close`` / ``evict`` drop the state (a step after eviction
is refused: the rollout it would continue is gone).

What this reproduces from the pipeline's ``__call__`` (diffusers 0.42.1), for one
request: the tier's canvas from the frame's aspect ratio, the action prompt (JSON
caption with the view point, resolution and duration templates), the text / vision /
action segments packed once per request, the initial latents (frame 0 clean, the rest
noise from the request's seed), a per-request copy of the UniPC scheduler, the
conditional (and with guidance > 1 the unconditional) transformer pass per step with
the condition positions' velocity zeroed, and the VAE decode; the condition frame is
encoded alone (first_frame_encoder: exact, see there). tests/unit/
test_world_sessions.py checks a step equals the pipeline called with the same inputs.
Not reproduced: FP8 mixed-precision schedules (ModelOpt checkpoints), sound, the
safety checker (off: ``cosmos_guardrail`` is not installable here).

Steps of different sessions (each at its own timestep, guided or not) share ONE
transformer call: cosmos3_batch.py packs them and keeps attention per sample.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import omni.models.diffusion as common
from omni.engines.base import DenoiseJob, EngineLoadError
from omni.wire.arrays import unpack_tree

PIPELINE = "Cosmos3OmniPipeline"
FPS = 24.0
TIERS = (256, 480, 704, 720)
VIEW_POINTS = ("ego_view", "third_person_view", "wrist_view", "concat_view")


@dataclass
class World:
    """One session's retained state: its first frame, its last, and what it is about."""

    first: Any  # PIL image
    last: Any
    prompt: str
    domain: str
    chunks: int = 0

    def nbytes(self) -> int:
        return sum(im.width * im.height * 3 for im in (self.first, self.last))


def _classes() -> dict[str, Any]:
    from diffusers import Cosmos3OmniPipeline

    return {PIPELINE: Cosmos3OmniPipeline}


def _pil(frame: Any) -> Any:
    from PIL import Image

    return Image.fromarray(np.ascontiguousarray(frame))


class Cosmos3WorldDenoiser:
    output = "video"
    OPTIONS = frozenset({"default_steps", "max_steps", "default_chunk", "max_chunk",
                         "default_guidance", "resolution_tier"})

    def __init__(self, pipe: Any, device: str, options: Mapping[str, Any]) -> None:
        from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import (
            _ACTION_RESOLUTION_BINS,
            _EMBODIMENT_TO_RAW_ACTION_DIM,
        )

        if not pipe.transformer.config.action_gen:
            raise EngineLoadError("this Cosmos 3 transformer was not trained with actions "
                                  "(action_gen false): it cannot serve world sessions")
        self.pipe, self.device = pipe, device
        self.dtype = pipe.transformer.dtype
        action_dim = pipe.transformer.config.action_dim or 0
        self.domains = {name: width for name, width in _EMBODIMENT_TO_RAW_ACTION_DIM.items()
                        if width <= action_dim}
        self.bins = _ACTION_RESOLUTION_BINS
        self.tier = int(options.get("resolution_tier", 256))
        if self.tier not in TIERS:
            raise EngineLoadError(f"resolution_tier must be one of {TIERS}")
        self.default_steps = int(options.get("default_steps", 35))
        self.max_steps = int(options.get("max_steps", 100))
        self.default_chunk = int(options.get("default_chunk", 4))
        self.max_chunk = int(options.get("max_chunk", 32))
        self.default_guidance = float(options.get("default_guidance", 1.0))
        self.worlds: dict[str, World] = {}
        from omni.models.cosmos3_batch import install

        self.attention = install(pipe.transformer)  # per-sample attention over packed calls

    def info(self) -> dict[str, Any]:
        return {"tasks": ["world_model"], "pipeline": PIPELINE, "fps": FPS,
                "domains": self.domains, "resolution_tier": self.tier,
                "default_steps": self.default_steps, "max_steps": self.max_steps,
                "default_chunk": self.default_chunk, "max_chunk": self.max_chunk,
                "frame_step": self.pipe.vae_scale_factor_temporal}

    # -- sessions -----------------------------------------------------------------------
    def end_session(self, session: str, op: str) -> bool:
        world = self.worlds.get(session)
        if world is None:
            return False
        if op == "reset":
            world.last, world.chunks = world.first, 0
        else:
            del self.worlds[session]
        return True

    def session_bytes(self) -> dict[str, int]:
        return {sid: world.nbytes() for sid, world in self.worlds.items()}

    # -- requests -----------------------------------------------------------------------
    def plan(self, inputs: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
        session = params.get("session")
        if not isinstance(session, str):
            raise ValueError("a world step belongs to a world session (AsyncOmni.open_world "
                             "or GET /v1/world)")
        image = inputs.get("image")
        if image is None and session not in self.worlds:
            raise ValueError("this world session has no state on the server (never opened "
                             "here, or evicted under the session budget): reset it")
        domain = inputs.get("domain")
        if domain not in self.domains:
            raise ValueError(f"unknown domain {domain!r}; this model serves "
                             f"{', '.join(sorted(self.domains))}")
        actions = unpack_tree(inputs.get("actions"))
        if not isinstance(actions, np.ndarray) or actions.ndim != 2 or actions.shape[0] < 1:
            raise ValueError("'actions' must be an array (T, width), T >= 1")
        width = self.domains[domain]
        if actions.shape[1] != width:
            raise ValueError(f"actions have width {actions.shape[1]}; domain {domain!r} "
                             f"takes {width}")
        if actions.dtype.kind not in "fiu" or not np.isfinite(actions).all():
            raise ValueError("'actions' must be finite numbers")
        chunk = common.bounded_int(params, "chunk_size", self.default_chunk, 1, self.max_chunk)
        if chunk % self.pipe.vae_scale_factor_temporal:
            raise ValueError(f"'chunk_size' must be a multiple of "
                             f"{self.pipe.vae_scale_factor_temporal} (frames = chunk_size + 1)")
        view = params.get("view_point", "ego_view")
        if view not in VIEW_POINTS:
            raise ValueError(f"'view_point' must be one of {', '.join(VIEW_POINTS)}")
        return {"session": session, "domain": domain, "chunk": chunk, "view": view,
                "prompt": common.prompt_of(inputs),
                "image": None if image is None else common.open_image(image, "image"),
                "actions": torch.from_numpy(actions.astype(np.float32)),
                "steps": common.bounded_int(params, "steps", self.default_steps, 1,
                                            self.max_steps),
                "guidance": common.guidance(params, self.default_guidance),
                "seed": common.seed_of(params)}

    @torch.inference_mode()
    def start(self, request_id: str, plan: dict[str, Any]) -> DenoiseJob:
        from diffusers import CosmosActionCondition

        world = self._world(plan)
        action = CosmosActionCondition(
            mode="forward_dynamics", chunk_size=plan["chunk"], domain_name=plan["domain"],
            resolution_tier=self.tier, raw_actions=plan["actions"], image=world.last,
            view_point=plan["view"])
        state = self._setup(action, world.prompt, plan)
        scheduler = copy.deepcopy(self.pipe.scheduler)
        if self.pipe.config.use_native_flow_schedule:
            n = plan["steps"]
            sigmas = np.linspace(1.0 - 1.0 / scheduler.config.num_train_timesteps, 0.0, n + 1)
            scheduler.set_timesteps(n, device=self.device, sigmas=sigmas[:-1])
        else:
            scheduler.set_timesteps(plan["steps"], device=self.device)
        latents = state.pop("latents")
        state.update(session=plan["session"], scale=plan["guidance"])
        return DenoiseJob(request_id, latents[None], scheduler.timesteps, scheduler, rows=1,
                          guided=plan["guidance"] > 1, seed=plan["seed"], state=state)

    def _world(self, plan: dict[str, Any]) -> World:
        if plan["image"] is not None:  # the session's first frame: (re)start its rollout
            self.worlds[plan["session"]] = World(plan["image"], plan["image"], plan["prompt"],
                                                 plan["domain"])
        world = self.worlds.get(plan["session"])
        if world is None:
            raise ValueError("this world session's state was evicted: reset it")
        return world

    def _setup(self, action: Any, prompt: str, plan: dict[str, Any]) -> dict[str, Any]:
        """The pipeline's per-request preparation (its __call__ steps 2-5)."""
        from omni.models.cosmos3_packing import packed_request

        return packed_request(self.pipe, action, prompt, self.bins[str(self.tier)],
                              common.generator(plan["seed"]), self.device, FPS)

    # -- denoising ----------------------------------------------------------------------
    def group_key(self, job: DenoiseJob) -> Any:
        return PIPELINE  # any steps of any sessions share one call (cosmos3_batch.py)

    @torch.inference_mode()
    def predict(self, jobs: list[DenoiseJob]) -> list[torch.Tensor]:
        from omni.models.cosmos3_packing import velocities

        out = velocities(self.pipe, jobs, self.attention, self.dtype, self.device,
                         latents=lambda job: job.latents[0],
                         actions=lambda job: job.state["action_latents"],
                         timestep=lambda job: job.timesteps[job.step].item())
        return [vision[None] for vision, _ in out]

    @torch.inference_mode()
    def decode(self, jobs: list[DenoiseJob]) -> list[dict[str, Any]]:
        pipe, out = self.pipe, []
        for job in jobs:
            latents = job.latents[0]
            vae_dtype = pipe.vae.dtype
            mean = pipe._vae_latents_mean.to(device=latents.device, dtype=vae_dtype)
            inv_std = pipe._vae_latents_inv_std.to(device=latents.device, dtype=vae_dtype)
            z = latents.to(vae_dtype) / inv_std.view(1, -1, 1, 1, 1) + mean.view(1, -1, 1, 1, 1)
            decoded = pipe.vae.decode(z).sample.to(latents.dtype)
            video = pipe.video_processor.postprocess_video(decoded, output_type="pt")[0]
            frames = (video.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1)
            frames = frames.contiguous().cpu()
            world = self.worlds.get(job.state["session"])
            if world is not None:
                world.last = _pil(frames[-1].numpy())
                world.chunks += 1
            out.append({"video": frames, "fps": FPS,
                        "chunk": 0 if world is None else world.chunks})
        return out


def first_frame_encoder(encode: Any, temporal: int) -> Any:
    """``Cosmos3OmniPipeline._encode_video`` for a clip that repeats one frame (how
    forward_dynamics conditions on an image): encode that frame alone and leave the other
    latent frames zero. Exact, not an approximation: the Wan VAE is causal (latent frame 0
    comes from pixel frame 0 alone) and the pipeline uses only latent frame 0 of a
    single-image condition (the others are multiplied by a zero mask). The pipeline
    encodes all chunk_size + 1 frames: about 4/5 of a tiny model's step on the CPU."""
    def encode_video(x: torch.Tensor) -> torch.Tensor:
        frames = x.shape[2]
        if frames == 1 or not torch.equal(x[:, :, 1:], x[:, :, :1].expand_as(x[:, :, 1:])):
            return encode(x)
        first = encode(x[:, :, :1])
        rest = first.new_zeros((*first.shape[:2], (frames - 1) // temporal, *first.shape[3:]))
        return torch.cat([first, rest], dim=2)
    return encode_video


def build_cosmos3_world(*, model_dir: str, device: str, dtype: str,
                        options: Mapping[str, Any]) -> Cosmos3WorldDenoiser:
    pipe = common.load_pipeline(model_dir, _classes(), device=device, dtype=dtype,
                                load_format=common.load_format(options), safety_checker=None,
                                enable_safety_checker=False)
    pipe._encode_video = first_frame_encoder(pipe._encode_video, pipe.vae_scale_factor_temporal)
    return Cosmos3WorldDenoiser(pipe, device, options)
