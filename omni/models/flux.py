"""FLUX.1 (text to image) and FLUX.1 Kontext (image edit) for the diffusion engine.

Loaded with diffusers' ``FluxPipeline`` / ``FluxKontextPipeline`` from a local release
directory; the adapter reuses the pipeline's pieces (CLIP + T5 prompt encoding, latent
packing, position ids, timesteps, VAE) and replaces its loop so that requests at
different steps share one transformer call. What it reproduces from the pipelines'
``__call__`` (diffusers 0.42):
- timesteps: sigmas linspace(1, 1/N, N) shifted by ``mu`` from the image's token count;
- ``guidance_scale`` is FLUX.1-dev's distilled guidance: an embedding input of the
  transformer, one value per row (so requests with different scales share a call), not
  a second pass; a release without it (schnell) gets none;
- "true CFG" (a second, negative pass) runs only when the stage option
  ``true_cfg_scale`` > 1 and the request has a negative prompt, as in diffusers (whose
  default scale 1 ignores a negative prompt);
- the T5 prompt is always padded to ``max_sequence_length`` tokens, so every row of a call
  has the same text length; rows share the position ids, so the group key is the image
  grid (and, for Kontext, the input image's grid);
- Kontext: the input image is resized to the closest of Kontext's preferred resolutions
  (stage option ``auto_resize``, on as in diffusers), VAE-encoded and packed after the
  noise latents in the sequence (its output is dropped); ``size: auto`` is that size.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

import omni.models.diffusion as common
from omni.engines.base import DenoiseJob, flag_option

T2I, EDIT = "FluxPipeline", "FluxKontextPipeline"


def _classes() -> dict[str, Any]:
    from diffusers import FluxKontextPipeline, FluxPipeline

    return {T2I: FluxPipeline, EDIT: FluxKontextPipeline}


class FluxDenoiser:
    output = "image"
    OPTIONS = common.LIMIT_OPTIONS | {"max_sequence_length", "true_cfg_scale", "auto_resize"}

    def __init__(self, pipe: Any, device: str, options: Mapping[str, Any]) -> None:
        """``pipe``: a loaded FluxPipeline or FluxKontextPipeline on ``device``."""
        self.pipe = pipe
        self.device = device
        self.edit = type(pipe).__name__ == EDIT
        self.scale = pipe.vae_scale_factor
        self.limits = common.limits(options, size_multiple=self.scale * 2, default_steps=28,
                                    default_guidance=2.5 if self.edit else 3.5)
        self.max_text_tokens = int(options.get("max_sequence_length", 512))
        self.true_cfg = float(options.get("true_cfg_scale", 1.0))
        self.auto_resize = flag_option(options, "auto_resize", True)
        self.distilled = bool(pipe.transformer.config.guidance_embeds)

    def info(self) -> dict[str, Any]:
        return {"tasks": ["edit"] if self.edit else ["generate"],
                "pipeline": type(self.pipe).__name__,
                "max_input_images": 1, **self.limits.info()}

    # -- requests ---------------------------------------------------------------------
    def plan(self, inputs: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
        image = common.edit_image(inputs.get("images") or [], self.edit, "FLUX.1 Kontext")
        plan = common.request_plan(inputs, params, self.limits) | {"image": image}
        size = params.get("size")
        if image is not None and size in (None, "auto"):
            width, height = self._input_dims(image)
            size = f"{width}x{height}"
        plan["width"], plan["height"] = common.parse_size(size, self.limits)
        return plan

    def _input_dims(self, image: Any) -> tuple[int, int]:
        """Kontext's size for the input image: (width, height)."""
        from diffusers.pipelines.flux.pipeline_flux_kontext import PREFERRED_KONTEXT_RESOLUTIONS

        height, width = self.pipe.image_processor.get_default_height_width(image)
        if self.auto_resize:
            aspect = width / height
            _, width, height = min((abs(aspect - w / h), w, h)
                                   for w, h in PREFERRED_KONTEXT_RESOLUTIONS)
        m = self.scale * 2
        return width // m * m, height // m * m

    @torch.inference_mode()
    def start(self, request_id: str, plan: dict[str, Any]) -> DenoiseJob:
        pipe, n = self.pipe, plan["n"]
        guided = self.true_cfg > 1 and plan["negative_prompt"] is not None
        pos = self._encode(plan["prompt"], n)
        neg = self._encode(plan["negative_prompt"], n) if guided else (None, None, None)
        channels = pipe.transformer.config.in_channels // 4
        gen = common.generator(plan["seed"])
        args = (n, channels, plan["height"], plan["width"], pos[0].dtype, self.device, gen)
        image_latents, grid = None, (plan["height"], plan["width"])
        if self.edit:
            image, cond_dims = self._edit_input(plan["image"])
            latents, image_latents, ids, image_ids = pipe.prepare_latents(image, *args)
            ids, grid = torch.cat([ids, image_ids]), grid + cond_dims
        else:
            latents, ids = pipe.prepare_latents(*args)
        scheduler, timesteps = self._timesteps(plan["steps"], latents.shape[1])
        state = {"pos": pos, "neg": neg, "ids": ids, "grid": grid,
                 "image_latents": image_latents, "true_cfg": self.true_cfg,
                 "guidance": plan["guidance"], "width": plan["width"],
                 "height": plan["height"], "tokens": self._prompt_tokens(plan["prompt"])}
        return DenoiseJob(request_id, latents, timesteps, scheduler, rows=n, guided=guided,
                          seed=plan["seed"], state=state)

    def _edit_input(self, image: Any) -> tuple[torch.Tensor, tuple[int, int]]:
        """Kontext: the VAE input for the input image and its (height, width)."""
        width, height = self._input_dims(image)
        processor = self.pipe.image_processor
        resized = processor.resize(image, height, width)
        return processor.preprocess(resized, height, width).to(self.device), (height, width)

    def _encode(self, prompt: str, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(T5 embeddings, CLIP pooled embedding, text position ids)."""
        return self.pipe.encode_prompt(prompt=prompt, prompt_2=None, device=self.device,
                                       num_images_per_prompt=n,
                                       max_sequence_length=self.max_text_tokens)

    def _prompt_tokens(self, prompt: str) -> int:
        """The T5 prompt's own tokens (the usage count; the model sees them padded)."""
        return len(self.pipe.tokenizer_2(prompt, truncation=True,
                                         max_length=self.max_text_tokens)["input_ids"])

    def _timesteps(self, steps: int, image_tokens: int) -> tuple[Any, torch.Tensor]:
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps

        scheduler = copy.deepcopy(self.pipe.scheduler)
        cfg = scheduler.config
        mu = calculate_shift(image_tokens, cfg.get("base_image_seq_len", 256),
                             cfg.get("max_image_seq_len", 4096), cfg.get("base_shift", 0.5),
                             cfg.get("max_shift", 1.15))
        sigmas = None if cfg.get("use_flow_sigmas") else np.linspace(1.0, 1 / steps, steps)
        timesteps, _ = retrieve_timesteps(scheduler, steps, self.device, sigmas=sigmas, mu=mu)
        scheduler.set_begin_index(0)
        return scheduler, timesteps

    # -- denoising --------------------------------------------------------------------
    def group_key(self, job: DenoiseJob) -> Any:
        return job.state["grid"]

    @torch.inference_mode()
    def predict(self, jobs: list[DenoiseJob]) -> list[torch.Tensor]:
        blocks = [(job, job.state["pos"]) for job in jobs]
        blocks += [(job, job.state["neg"]) for job in jobs if job.guided]
        x = torch.cat([common.with_image_latents(job) for job, _ in blocks])
        t = torch.cat([job.timesteps[job.step].expand(job.rows) for job, _ in blocks])
        guidance = None
        if self.distilled:
            guidance = torch.cat([torch.full((job.rows,), job.state["guidance"],
                                             device=x.device, dtype=torch.float32)
                                  for job, _ in blocks])
        out = self.pipe.transformer(
            hidden_states=x, timestep=t.to(x.dtype) / 1000, guidance=guidance,
            pooled_projections=torch.cat([text[1] for _, text in blocks]),
            encoder_hidden_states=torch.cat([text[0] for _, text in blocks]),
            txt_ids=blocks[0][1][2], img_ids=blocks[0][0].state["ids"],
            return_dict=False)[0]
        parts = out.split([job.rows for job, _ in blocks])
        parts = [p[:, :job.latents.shape[1]] for (job, _), p in zip(blocks, parts, strict=True)]
        uncond = {id(job): p for (job, _), p in zip(blocks[len(jobs):], parts[len(jobs):],
                                                   strict=True)}
        results = []
        for job, cond in zip(jobs, parts[:len(jobs)], strict=True):
            neg = uncond.get(id(job))
            results.append(cond if neg is None else neg + job.state["true_cfg"] * (cond - neg))
        return results

    @torch.inference_mode()
    def decode(self, jobs: list[DenoiseJob]) -> list[dict[str, Any]]:
        return decode_by_size(jobs, self._pixels)

    @torch.inference_mode()
    def preview(self, job: DenoiseJob) -> dict[str, Any]:
        return common.flow_preview(job, self._pixels)

    def _pixels(self, job: DenoiseJob, packed: torch.Tensor) -> torch.Tensor:
        vae = self.pipe.vae
        latents = self.pipe._unpack_latents(packed, job.state["height"], job.state["width"],
                                            self.scale)
        latents = latents / vae.config.scaling_factor + vae.config.shift_factor
        return common.to_uint8(vae.decode(latents.to(vae.dtype), return_dict=False)[0])


def decode_by_size(jobs: list[DenoiseJob],
                   pixels_of: Callable[[DenoiseJob, torch.Tensor], torch.Tensor],
                   ) -> list[dict[str, Any]]:
    """Decode jobs one VAE call per image size: the engine hands over finished jobs of
    equal latent shape together, and packed latents of 64x32 and 32x64 images have the
    same shape."""
    sizes: dict[Any, list[DenoiseJob]] = {}
    for job in jobs:
        sizes.setdefault(job.state["grid"][:2], []).append(job)
    done = {}
    for same in sizes.values():
        pixels = pixels_of(same[0], torch.cat([job.latents for job in same]))
        for job, images in zip(same, pixels.split([j.rows for j in same]), strict=True):
            done[id(job)] = {"images": images, "text_tokens": job.state["tokens"],
                             "image_tokens": int(job.latents.shape[1]) * job.rows}
    return [done[id(job)] for job in jobs]


def build_flux(*, model_dir: str, device: str, dtype: str,
               options: Mapping[str, Any]) -> FluxDenoiser:
    pipe = common.load_pipeline(model_dir, _classes(), device=device, dtype=dtype,
                                load_format=common.load_format(options))
    return FluxDenoiser(pipe, device, options)
