"""Wan 2.x text-to-video and image-to-video for the diffusion engine.

Loaded with diffusers' ``WanPipeline`` / ``WanImageToVideoPipeline`` from a local
release directory; the adapter reuses the pipeline's pieces and replaces its loop so
that requests at different steps share one transformer call. What it reproduces from
the pipelines' ``__call__`` (diffusers 0.42):
- frames: Wan's VAE compresses time 4x, so a video has 4k+1 frames (the API maps
  ``seconds`` to the nearest such count at the release's 16 fps);
- guidance: uncond + scale * (cond - uncond) when guidance_scale > 1, the negative
  prompt defaulting to "" as in diffusers;
- Wan 2.2 A14B two-expert releases (``boundary_ratio``): steps at or above the boundary
  timestep run ``transformer`` (high noise) with ``guidance_scale``, later ones
  ``transformer_2`` (low noise) with ``guidance_scale_2`` (default: guidance_scale); the
  expert is part of the group key, so one call never mixes experts, while requests on
  the same side of the boundary share calls whatever their step;
- image-to-video (Wan 2.1 I2V, Wan 2.2 I2V A14B): the reference image is resized to the
  video size, VAE-encoded as the first frame of a mask + condition tensor concatenated to
  the latents on the channel axis, and (Wan 2.1 I2V only: Wan 2.2 has no image encoder)
  CLIP-encoded for the image cross-attention;
- Wan 2.2 TI2V-5B (``expand_timesteps``): one WanPipeline release serves text- and
  image-to-video. The transformer takes a timestep per latent token; an image request's
  first latent frame is the VAE-encoded image, held fixed (timestep 0 on its tokens, put
  back before each call and before decoding), as WanImageToVideoPipeline does when
  loaded from the same release.
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


def image_pipeline(pipe: Any) -> Any:
    """TI2V: the image-to-video pipeline of a WanPipeline release, sharing its modules
    (what ``WanImageToVideoPipeline.from_pretrained`` on the same directory builds)."""
    from diffusers import WanImageToVideoPipeline

    return WanImageToVideoPipeline(**pipe.components, boundary_ratio=pipe.config.boundary_ratio,
                                   expand_timesteps=True)


class WanDenoiser:
    output = "video"
    OPTIONS = common.LIMIT_OPTIONS | {"max_sequence_length"}

    def __init__(self, pipe: Any, device: str, options: Mapping[str, Any]) -> None:
        """``pipe``: a loaded WanPipeline or WanImageToVideoPipeline on ``device``."""
        self.pipe = pipe
        self.device = device
        self.i2v = type(self.pipe).__name__ == I2V
        self.expand = bool(self.pipe.config.get("expand_timesteps"))
        # the pipeline whose prepare_latents conditions on an image (None: text only)
        self.image_pipe = (self.pipe if self.i2v else
                           image_pipeline(self.pipe) if self.expand else None)
        model = self.pipe.transformer or self.pipe.transformer_2
        self.temporal = self.pipe.vae_scale_factor_temporal
        self.spatial = self.pipe.vae_scale_factor_spatial * model.config.patch_size[1]
        self.dtype = model.dtype
        # the releases' own defaults: TI2V-5B makes 1280x704 at 24 fps, 121 frames
        video = (dict(default_size="1280x704", fps=24, default_frames=121) if self.expand
                 else dict(default_size="832x480", fps=16, default_frames=81))
        self.limits = common.limits(
            options, size_multiple=self.spatial, max_pixels=1280 * 720, max_side=1280,
            default_steps=50, default_guidance=5.0, max_n=1, max_frames=129, **video)
        if (self.limits.max_frames - 1) % self.temporal:
            raise EngineLoadError(f"max_frames must be {self.temporal}k+1")
        self.max_text_tokens = int(options.get("max_sequence_length", 512))
        ratio = self.pipe.config.get("boundary_ratio")
        self.boundary = (None if ratio is None else
                         ratio * self.pipe.scheduler.config.num_train_timesteps)

    def info(self) -> dict[str, Any]:
        tasks = ([] if self.i2v else ["text_to_video"]) + (
            ["image_to_video"] if self.image_pipe is not None else [])
        return {"tasks": tasks,
                "pipeline": type(self.pipe).__name__,
                "max_input_images": 1, "frame_step": self.temporal,
                "guidance_scale_2": self.boundary is not None, **self.limits.info()}

    # -- requests ---------------------------------------------------------------------
    def plan(self, inputs: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
        images = inputs.get("images") or []
        if self.i2v and not images:
            raise ValueError("this is an image-to-video model: send 'input_reference' "
                             "(the first frame)")
        if images and self.image_pipe is None:
            raise ValueError("this is a text-to-video model and takes no 'input_reference'; "
                             "an image-to-video model (e.g. Wan I2V) can")
        if len(images) > 1:
            raise ValueError("one reference image per video")
        frames = common.video_frames(params, self.limits, self.temporal, suggest=True)
        width, height = common.parse_size(params.get("size"), self.limits)
        plan = common.request_plan(inputs, params, self.limits, no_negative="")
        return plan | {"guidance_2": self._low_noise_guidance(params), "frames": frames,
                       "width": width, "height": height,
                       "image": (common.open_image(images[0], "input_reference")
                                 if images else None)}

    def _low_noise_guidance(self, params: Mapping[str, Any]) -> float | None:
        """``guidance_scale_2``: the low-noise expert's scale (two-expert releases only)."""
        if params.get("guidance_scale_2") is None:
            return None
        if self.boundary is None:
            raise ValueError("'guidance_scale_2' is for two-expert (Wan 2.2 A14B) models")
        return common.guidance({"guidance_scale": params["guidance_scale_2"]}, 0.0)

    @torch.inference_mode()
    def start(self, request_id: str, plan: dict[str, Any]) -> DenoiseJob:
        pipe, n = self.pipe, plan["n"]
        scales = (plan["guidance"], plan["guidance"] if plan["guidance_2"] is None
                  else plan["guidance_2"])
        guided = scales[0] > 1  # as diffusers: guidance_scale_2 alone does not turn it on
        pos, neg = pipe.encode_prompt(
            prompt=plan["prompt"], negative_prompt=plan["negative_prompt"],
            do_classifier_free_guidance=guided, num_videos_per_prompt=n,
            max_sequence_length=self.max_text_tokens, device=self.device)
        state = {"pos": pos.to(self.dtype), "neg": None if neg is None else neg.to(self.dtype),
                 "scales": scales, "condition": None, "image_embeds": None, "mask": None}
        scheduler = copy.deepcopy(pipe.scheduler)
        scheduler.set_timesteps(plan["steps"], device=self.device)
        gen = common.generator(plan["seed"])
        size = (plan["height"], plan["width"], plan["frames"], torch.float32, self.device, gen)
        if plan["image"] is not None:
            latents = self._i2v_latents(plan, state, n, size)
        else:
            model = pipe.transformer or pipe.transformer_2
            latents = pipe.prepare_latents(n, model.config.in_channels, *size)
            if self.expand:  # every token at the step's timestep
                state["mask"] = torch.ones((1, 1, *latents.shape[2:]), device=self.device)
        scheduler.set_begin_index(0)
        return DenoiseJob(request_id, latents, scheduler.timesteps, scheduler, rows=n,
                          guided=guided, seed=plan["seed"], state=state)

    def _i2v_latents(self, plan: dict[str, Any], state: dict[str, Any], n: int,
                     size: tuple) -> torch.Tensor:
        pipe = self.image_pipe
        if pipe.transformer is not None and pipe.transformer.config.image_dim is not None:
            embeds = pipe.encode_image(plan["image"], self.device)
            state["image_embeds"] = embeds.repeat(n, 1, 1).to(self.dtype)
        image = pipe.video_processor.preprocess(plan["image"], height=plan["height"],
                                                width=plan["width"])
        latents, state["condition"], *mask = pipe.prepare_latents(
            image.to(self.device, dtype=torch.float32), n, pipe.vae.config.z_dim, *size)
        if mask:  # TI2V: 0 on the first latent frame (the image), 1 elsewhere
            state["mask"] = mask[0]
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
        t = torch.cat([self._timestep(j) for j, _ in blocks])
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
            scale = job.state["scales"][self._expert(job)]
            results.append(cond if neg is None else neg + scale * (cond - neg))
        return results

    def _timestep(self, job: DenoiseJob) -> torch.Tensor:
        """(rows,), or (rows, tokens) for TI2V: the mask's patches times t, as diffusers."""
        t = job.timesteps[job.step]
        mask = job.state["mask"]
        if mask is None:
            return t.expand(job.rows)
        _, ph, pw = (self.pipe.transformer or self.pipe.transformer_2).config.patch_size
        return (mask[0][0][:, ::ph, ::pw] * t).flatten().unsqueeze(0).expand(job.rows, -1)

    @staticmethod
    def _with_condition(job: DenoiseJob) -> torch.Tensor:
        """TI2V image requests: the first latent frame is the image's, whatever the step."""
        mask, condition = job.state["mask"], job.state["condition"]
        if mask is None or condition is None:
            return job.latents
        return (1 - mask) * condition + mask * job.latents

    def _model_input(self, job: DenoiseJob) -> torch.Tensor:
        condition = job.state["condition"]
        if condition is None or self.expand:
            return self._with_condition(job)
        return torch.cat([job.latents, condition], 1)

    @torch.inference_mode()
    def decode(self, jobs: list[DenoiseJob]) -> list[dict[str, Any]]:
        vae = self.pipe.vae
        latents = torch.cat([self._with_condition(job) for job in jobs]).to(vae.dtype)
        shape = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents)
        std = torch.tensor(vae.config.latents_std).view(shape).to(latents)
        video = vae.decode(latents * std + mean, return_dict=False)[0]  # (n, C, F, H, W)
        frames = common.to_uint8(video.movedim(1, 2))  # (n, F, H, W, C)
        return [{"video": part[0] if job.rows == 1 else part, "fps": self.limits.fps}
                for job, part in zip(jobs, frames.split([j.rows for j in jobs]), strict=True)]


def build_wan(*, model_dir: str, device: str, dtype: str,
              options: Mapping[str, Any]) -> WanDenoiser:
    pipe = common.load_pipeline(model_dir, _classes(), device=device, dtype=dtype,
                                load_format=common.load_format(options))
    return WanDenoiser(pipe, device, options)
