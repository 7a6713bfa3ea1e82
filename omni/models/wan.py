"""Wan 2.x text-to-video and image-to-video for the diffusion engine.

Loaded with diffusers' ``WanPipeline`` / ``WanImageToVideoPipeline`` from a local
release directory; the adapter reuses the pipeline's pieces and replaces its loop so
that requests at different steps share one transformer call. What it reproduces from
the pipelines' ``__call__`` (diffusers 0.42):
- frames: Wan's VAE compresses time 4x, so a video has 4k+1 frames (the API maps
  ``seconds`` to the nearest such count at the release's 16 fps);
- guidance: uncond + scale * (cond - uncond) when guidance_scale > 1, the negative
  prompt defaulting to "" as in diffusers;
- Wan 2.2 two-expert releases (``boundary_ratio``): steps at or above the boundary
  timestep run ``transformer``, later ones ``transformer_2`` (the expert is part of the
  group key, so one call never mixes experts);
- image-to-video: the reference image is resized to the video size, VAE-encoded as the
  first frame of a mask + condition tensor concatenated to the latents on the channel
  axis, and (Wan 2.1 I2V) CLIP-encoded for the image cross-attention.
Wan 2.2 TI2V (``expand_timesteps``: a timestep per token) is refused at load.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

import omni.models.diffusion as common
from omni.engines.base import DenoiseJob, EngineLoadError

T2V, I2V = "WanPipeline", "WanImageToVideoPipeline"


def _classes() -> dict[str, Any]:
    from diffusers import WanImageToVideoPipeline, WanPipeline

    return {T2V: WanPipeline, I2V: WanImageToVideoPipeline}


def frames_for(seconds: float, fps: int, temporal: int) -> int:
    """The frame count nearest ``seconds`` at ``fps`` that Wan's VAE can take
    (temporal * k + 1)."""
    k = max(1, round(seconds * fps / temporal))
    return temporal * k + 1


class WanDenoiser:
    output = "video"
    OPTIONS = common.LIMIT_OPTIONS | {"max_sequence_length"}

    def __init__(self, pipe: Any, device: str, options: Mapping[str, Any]) -> None:
        """``pipe``: a loaded WanPipeline or WanImageToVideoPipeline on ``device``."""
        self.pipe = pipe
        if self.pipe.config.get("expand_timesteps"):
            raise EngineLoadError("Wan 2.2 TI2V (expand_timesteps) is not supported by this "
                                  "build")
        self.device = device
        self.i2v = type(self.pipe).__name__ == I2V
        model = self.pipe.transformer or self.pipe.transformer_2
        self.temporal = self.pipe.vae_scale_factor_temporal
        self.spatial = self.pipe.vae_scale_factor_spatial * model.config.patch_size[1]
        self.dtype = model.dtype
        self.limits = common.limits(
            options, size_multiple=self.spatial, default_size="832x480",
            max_pixels=1280 * 720, max_side=1280, default_steps=50, default_guidance=5.0,
            max_n=1, fps=16, default_frames=81, max_frames=129)
        if (self.limits.max_frames - 1) % self.temporal:
            raise EngineLoadError(f"max_frames must be {self.temporal}k+1")
        self.max_text_tokens = int(options.get("max_sequence_length", 512))
        ratio = self.pipe.config.get("boundary_ratio")
        self.boundary = (None if ratio is None else
                         ratio * self.pipe.scheduler.config.num_train_timesteps)

    def info(self) -> dict[str, Any]:
        return {"tasks": ["image_to_video"] if self.i2v else ["text_to_video"],
                "pipeline": type(self.pipe).__name__,
                "max_input_images": 1, "frame_step": self.temporal,
                **self.limits.info()}

    # -- requests ---------------------------------------------------------------------
    def plan(self, inputs: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
        images = inputs.get("images") or []
        if self.i2v and not images:
            raise ValueError("this is an image-to-video model: send 'input_reference' "
                             "(the first frame)")
        if images and not self.i2v:
            raise ValueError("this is a text-to-video model and takes no 'input_reference'; "
                             "an image-to-video model (e.g. Wan I2V) can")
        if len(images) > 1:
            raise ValueError("one reference image per video")
        lim = self.limits
        frames = common.bounded_int(params, "frames", lim.default_frames, 1, lim.max_frames)
        if (frames - 1) % self.temporal:
            raise ValueError(f"'frames' must be {self.temporal}k+1 for this model "
                             f"(e.g. {frames_for(frames / lim.fps, lim.fps, self.temporal)})")
        width, height = common.parse_size(params.get("size"), lim)
        return {"prompt": common.prompt_of(inputs),
                "negative_prompt": common.prompt_of(inputs, "negative_prompt", False),
                "steps": common.bounded_int(params, "steps", lim.default_steps, 1,
                                            lim.max_steps),
                "n": common.bounded_int(params, "n", 1, 1, lim.max_n),
                "guidance": common.guidance(params, lim.default_guidance),
                "seed": common.seed_of(params), "frames": frames, "width": width,
                "height": height,
                "image": common.open_image(images[0], "input_reference") if images else None}

    @torch.inference_mode()
    def start(self, request_id: str, plan: dict[str, Any]) -> DenoiseJob:
        pipe, n = self.pipe, plan["n"]
        guided = plan["guidance"] > 1
        pos, neg = pipe.encode_prompt(
            prompt=plan["prompt"], negative_prompt=plan["negative_prompt"],
            do_classifier_free_guidance=guided, num_videos_per_prompt=n,
            max_sequence_length=self.max_text_tokens, device=self.device)
        state = {"pos": pos.to(self.dtype), "neg": None if neg is None else neg.to(self.dtype),
                 "scale": plan["guidance"], "condition": None, "image_embeds": None}
        scheduler = copy.deepcopy(pipe.scheduler)
        scheduler.set_timesteps(plan["steps"], device=self.device)
        gen = common.generator(plan["seed"])
        size = (plan["height"], plan["width"], plan["frames"], torch.float32, self.device, gen)
        if self.i2v:
            latents = self._i2v_latents(plan, state, n, size)
        else:
            latents = pipe.prepare_latents(n, pipe.transformer.config.in_channels, *size)
        scheduler.set_begin_index(0)
        return DenoiseJob(request_id, latents, scheduler.timesteps, scheduler, rows=n,
                          guided=guided, seed=plan["seed"], state=state)

    def _i2v_latents(self, plan: dict[str, Any], state: dict[str, Any], n: int,
                     size: tuple) -> torch.Tensor:
        pipe = self.pipe
        model = pipe.transformer or pipe.transformer_2
        if model.config.image_dim is not None:
            embeds = pipe.encode_image(plan["image"], self.device)
            state["image_embeds"] = embeds.repeat(n, 1, 1).to(self.dtype)
        image = pipe.video_processor.preprocess(plan["image"], height=plan["height"],
                                                width=plan["width"])
        latents, state["condition"] = pipe.prepare_latents(
            image.to(self.device, dtype=torch.float32), n, pipe.vae.config.z_dim, *size)
        return latents

    # -- denoising --------------------------------------------------------------------
    def _expert(self, job: DenoiseJob) -> int:
        """0: ``transformer``; 1: ``transformer_2`` (Wan 2.2 low-noise steps)."""
        t = job.timesteps[job.step]
        return 0 if self.boundary is None or t >= self.boundary else 1

    def group_key(self, job: DenoiseJob) -> Any:
        return (tuple(job.latents.shape[1:]), self._expert(job))

    @torch.inference_mode()
    def predict(self, jobs: list[DenoiseJob]) -> list[torch.Tensor]:
        model = self.pipe.transformer if self._expert(jobs[0]) == 0 else self.pipe.transformer_2
        guided = [j for j in jobs if j.guided]
        blocks = [(j, j.state["pos"]) for j in jobs] + [(j, j.state["neg"]) for j in guided]
        x = torch.cat([self._model_input(j) for j, _ in blocks]).to(self.dtype)
        t = torch.cat([j.timesteps[j.step].expand(j.rows) for j, _ in blocks])
        kwargs = {}
        if self.i2v and blocks[0][0].state["image_embeds"] is not None:
            kwargs["encoder_hidden_states_image"] = torch.cat(
                [j.state["image_embeds"] for j, _ in blocks])
        out = model(hidden_states=x, timestep=t,
                    encoder_hidden_states=torch.cat([text for _, text in blocks]),
                    return_dict=False, **kwargs)[0]
        parts = out.split([j.rows for j, _ in blocks])
        uncond = {id(j): p for j, p in zip(guided, parts[len(jobs):], strict=True)}
        results = []
        for job, cond in zip(jobs, parts[:len(jobs)], strict=True):
            neg = uncond.get(id(job))
            results.append(cond if neg is None else neg + job.state["scale"] * (cond - neg))
        return results

    @staticmethod
    def _model_input(job: DenoiseJob) -> torch.Tensor:
        condition = job.state["condition"]
        return job.latents if condition is None else torch.cat([job.latents, condition], 1)

    @torch.inference_mode()
    def decode(self, jobs: list[DenoiseJob]) -> list[dict[str, Any]]:
        vae = self.pipe.vae
        latents = torch.cat([job.latents for job in jobs]).to(vae.dtype)
        shape = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents)
        std = torch.tensor(vae.config.latents_std).view(shape).to(latents)
        video = vae.decode(latents * std + mean, return_dict=False)[0]  # (n, C, F, H, W)
        frames = common.to_uint8(video.movedim(1, 2))  # (n, F, H, W, C)
        return [{"video": part[0] if job.rows == 1 else part, "fps": self.limits.fps}
                for job, part in zip(jobs, frames.split([j.rows for j in jobs]), strict=True)]


def build_wan(*, model_dir: str, device: str, dtype: str,
              options: Mapping[str, Any]) -> WanDenoiser:
    pipe = common.load_pipeline(model_dir, _classes(), device=device, dtype=dtype)
    return WanDenoiser(pipe, device, options)
