"""LTX-Video text-to-video and image-to-video for the diffusion engine.

Loaded with diffusers' ``LTXPipeline`` from a local release directory (Lightricks/LTX-Video
ships one ``LTXPipeline`` folder; image-to-video is ``LTXImageToVideoPipeline`` over the
same modules, built here from them). The adapter reuses the pipelines' pieces and replaces
their loop so that requests at different steps share one transformer call. What it
reproduces from the pipelines' ``__call__`` (diffusers 0.42):
- latents are packed to tokens (B, F*H*W, C); frames are 8k+1 (the VAE compresses time
  8x), sizes multiples of 32; the transformer's RoPE is scaled by the frame rate, so the
  frame rate (the stage's ``fps``) is part of the group key with the latent grid;
- the schedule: FlowMatchEuler on ``linspace(1, 1/steps)`` sigmas shifted by ``mu`` from
  the token count (dynamic shifting), per request;
- guidance: uncond + scale * (cond - uncond) when guidance_scale > 1 (default 3), text
  padded to 128 tokens with its attention mask;
- image-to-video: the image is VAE-encoded (sampled with the request's generator) as
  latent frame 0, whose tokens get timestep 0 and which the scheduler never steps (a
  wrapper steps frames 1..F only); text- and image-conditioned requests share calls
  (a per-token timestep for all rows of such a call);
- decode: timestep-conditioned VAEs (0.9.1+) decode at ``decode_timestep`` after mixing
  ``decode_noise_scale`` of fresh noise from the request's generator (stage options, the
  pipeline's defaults 0.0 / = decode_timestep; Lightricks suggests 0.03 / 0.025).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

import omni.models.diffusion as common
from omni.engines.base import DenoiseJob, EngineLoadError

T2V, I2V = "LTXPipeline", "LTXImageToVideoPipeline"


def _classes() -> dict[str, Any]:
    from diffusers import LTXImageToVideoPipeline, LTXPipeline

    return {T2V: LTXPipeline, I2V: LTXImageToVideoPipeline}


class FirstFrameHeld:
    """An image-to-video request's scheduler: steps latent frames 1.. and keeps frame 0
    (the image), as LTXImageToVideoPipeline's loop does; the engine calls ``step``."""

    def __init__(self, scheduler: Any, pipe: Any, grid: tuple[int, int, int]) -> None:
        self.scheduler, self.pipe, self.grid = scheduler, pipe, grid

    def _unpack(self, tokens: torch.Tensor) -> torch.Tensor:
        p = self.pipe
        return p._unpack_latents(tokens, *self.grid, p.transformer_spatial_patch_size,
                                 p.transformer_temporal_patch_size)

    def step(self, model_output: torch.Tensor, t: Any, latents: torch.Tensor,
             return_dict: bool = False) -> tuple[torch.Tensor]:
        noise, video = self._unpack(model_output), self._unpack(latents)
        stepped = self.scheduler.step(noise[:, :, 1:], t, video[:, :, 1:], return_dict=False)[0]
        video = torch.cat([video[:, :, :1], stepped], dim=2)
        p = self.pipe
        return (p._pack_latents(video, p.transformer_spatial_patch_size,
                                p.transformer_temporal_patch_size),)


class LTXVideoDenoiser:
    output = "video"
    OPTIONS = common.LIMIT_OPTIONS | {"max_sequence_length", "decode_timestep",
                                      "decode_noise_scale"}

    def __init__(self, pipe: Any, device: str, options: Mapping[str, Any]) -> None:
        """``pipe``: a loaded LTXPipeline (both tasks) or LTXImageToVideoPipeline."""
        from diffusers import LTXImageToVideoPipeline

        self.pipe, self.device = pipe, device
        self.image_only = type(pipe).__name__ == I2V
        self.image_pipe = pipe if self.image_only else LTXImageToVideoPipeline(**pipe.components)
        self.temporal = pipe.vae_temporal_compression_ratio
        self.spatial = pipe.vae_spatial_compression_ratio
        self.dtype = pipe.transformer.dtype
        self.limits = common.limits(
            options, size_multiple=self.spatial, default_size="704x480",
            max_pixels=1280 * 720, max_side=1280, default_steps=50, default_guidance=3.0,
            max_n=1, fps=25, default_frames=161, max_frames=257)
        if (self.limits.max_frames - 1) % self.temporal:
            raise EngineLoadError(f"max_frames must be {self.temporal}k+1")
        self.max_text_tokens = int(options.get("max_sequence_length", 128))
        self.decode_timestep = float(options.get("decode_timestep", 0.0))
        self.decode_noise_scale = float(options.get("decode_noise_scale",
                                                    self.decode_timestep))

    def info(self) -> dict[str, Any]:
        tasks = ([] if self.image_only else ["text_to_video"]) + ["image_to_video"]
        return {"tasks": tasks, "pipeline": type(self.pipe).__name__,
                "max_input_images": 1, "frame_step": self.temporal, **self.limits.info()}

    # -- requests ---------------------------------------------------------------------
    def plan(self, inputs: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
        images = inputs.get("images") or []
        if self.image_only and not images:
            raise ValueError("this is an image-to-video model: send 'input_reference' "
                             "(the first frame)")
        if len(images) > 1:
            raise ValueError("one reference image per video")
        frames = common.video_frames(params, self.limits, self.temporal)
        width, height = common.parse_size(params.get("size"), self.limits)
        plan = common.request_plan(inputs, params, self.limits, no_negative="", batched=False)
        return plan | {"frames": frames, "width": width, "height": height,
                       "image": (common.open_image(images[0], "input_reference")
                                 if images else None)}

    @torch.inference_mode()
    def start(self, request_id: str, plan: dict[str, Any]) -> DenoiseJob:
        image = plan["image"]
        pipe = self.pipe if image is None else self.image_pipe
        guided = plan["guidance"] > 1
        pos, pos_mask, neg, neg_mask = pipe.encode_prompt(
            prompt=plan["prompt"], negative_prompt=plan["negative_prompt"],
            do_classifier_free_guidance=guided, num_videos_per_prompt=1,
            max_sequence_length=self.max_text_tokens, device=self.device)
        grid = ((plan["frames"] - 1) // self.temporal + 1, plan["height"] // self.spatial,
                plan["width"] // self.spatial)
        gen = common.generator(plan["seed"])
        size = (pipe.transformer.config.in_channels, plan["height"], plan["width"],
                plan["frames"], torch.float32, self.device, gen)
        state = {"pos": (pos.to(self.dtype), pos_mask), "grid": grid, "generator": gen,
                 "neg": None if neg is None else (neg.to(self.dtype), neg_mask),
                 "scale": plan["guidance"], "first_frame": None}
        if image is None:
            latents = pipe.prepare_latents(1, *size)
        else:
            pixels = pipe.video_processor.preprocess(image, height=plan["height"],
                                                     width=plan["width"])
            latents, state["first_frame"] = pipe.prepare_latents(
                pixels.to(self.device, dtype=self.dtype), 1, *size)
        scheduler, timesteps = self._schedule(plan["steps"], grid[0] * grid[1] * grid[2])
        if image is not None:
            scheduler = FirstFrameHeld(scheduler, pipe, grid)
        return DenoiseJob(request_id, latents, timesteps, scheduler, rows=1, guided=guided,
                          seed=plan["seed"], state=state)

    def _schedule(self, steps: int, tokens: int) -> tuple[Any, torch.Tensor]:
        """A copy of the release's scheduler set as the pipelines set it."""
        from diffusers.pipelines.ltx.pipeline_ltx import calculate_shift, retrieve_timesteps

        scheduler = copy.deepcopy(self.pipe.scheduler)
        cfg = scheduler.config
        mu = calculate_shift(tokens, cfg.get("base_image_seq_len", 256),
                             cfg.get("max_image_seq_len", 4096), cfg.get("base_shift", 0.5),
                             cfg.get("max_shift", 1.15))
        sigmas = np.linspace(1.0, 1 / steps, steps)
        timesteps, _ = retrieve_timesteps(scheduler, steps, self.device, sigmas=sigmas, mu=mu)
        return scheduler, timesteps

    # -- denoising --------------------------------------------------------------------
    def group_key(self, job: DenoiseJob) -> Any:
        return (tuple(job.latents.shape[1:]), job.state["grid"])

    @torch.inference_mode()
    def predict(self, jobs: list[DenoiseJob]) -> list[torch.Tensor]:
        guided = [j for j in jobs if j.guided]
        blocks = [(j, j.state["pos"]) for j in jobs] + [(j, j.state["neg"]) for j in guided]
        per_token = any(j.state["first_frame"] is not None for j in jobs)
        frames, height, width = jobs[0].state["grid"]
        fps = self.limits.fps
        out = self.pipe.transformer(
            hidden_states=torch.cat([j.latents for j, _ in blocks]).to(self.dtype),
            encoder_hidden_states=torch.cat([text for _, (text, _) in blocks]),
            encoder_attention_mask=torch.cat([mask for _, (_, mask) in blocks]),
            timestep=torch.cat([self._timestep(j, per_token) for j, _ in blocks]),
            num_frames=frames, height=height, width=width,
            rope_interpolation_scale=(self.temporal / fps, self.spatial, self.spatial),
            return_dict=False)[0].float()
        parts = out.split([j.rows for j, _ in blocks])
        uncond = {id(j): p for j, p in zip(guided, parts[len(jobs):], strict=True)}
        results = []
        for job, cond in zip(jobs, parts[:len(jobs)], strict=True):
            neg = uncond.get(id(job))
            results.append(cond if neg is None else neg + job.state["scale"] * (cond - neg))
        return results

    @staticmethod
    def _timestep(job: DenoiseJob, per_token: bool) -> torch.Tensor:
        """(rows,), or (rows, tokens) when the call holds an image request: 0 on the
        image's tokens (the pipeline's ``t * (1 - conditioning_mask)``)."""
        t = job.timesteps[job.step].expand(job.rows)
        if not per_token:
            return t
        first = job.state["first_frame"]
        if first is None:
            return t.unsqueeze(-1).expand(-1, job.latents.shape[1])
        return t.unsqueeze(-1) * (1 - first)

    @torch.inference_mode()
    def decode(self, jobs: list[DenoiseJob]) -> list[dict[str, Any]]:
        vae = self.pipe.vae
        latents = torch.cat([self._decode_input(job) for job in jobs]).to(vae.dtype)
        timestep = None
        if vae.config.timestep_conditioning:
            timestep = torch.full((len(jobs),), self.decode_timestep, device=latents.device,
                                  dtype=latents.dtype)
        video = vae.decode(latents, timestep, return_dict=False)[0]  # (n, C, F, H, W)
        frames = common.to_uint8(video.movedim(1, 2))
        return [{"video": part[0], "fps": self.limits.fps}
                for part in frames.split([j.rows for j in jobs])]

    def _decode_input(self, job: DenoiseJob) -> torch.Tensor:
        """Unpacked, denormalized latents; with the pipelines' decode noise mixed in."""
        from diffusers.utils.torch_utils import randn_tensor

        pipe, vae = self.pipe, self.pipe.vae
        latents = pipe._unpack_latents(job.latents, *job.state["grid"],
                                       pipe.transformer_spatial_patch_size,
                                       pipe.transformer_temporal_patch_size)
        latents = pipe._denormalize_latents(latents, vae.latents_mean, vae.latents_std,
                                            vae.config.scaling_factor).to(self.dtype)
        if not vae.config.timestep_conditioning:
            return latents
        noise = randn_tensor(latents.shape, generator=job.state["generator"],
                             device=latents.device, dtype=latents.dtype)
        scale = self.decode_noise_scale
        return (1 - scale) * latents + scale * noise


def build_ltx_video(*, model_dir: str, device: str, dtype: str,
                    options: Mapping[str, Any]) -> LTXVideoDenoiser:
    pipe = common.load_pipeline(model_dir, _classes(), device=device, dtype=dtype,
                                load_format=common.load_format(options))
    return LTXVideoDenoiser(pipe, device, options)
