"""HunyuanImage 2.1 (text to image; the base release and the distilled one) for the
diffusion engine.

Loaded with diffusers' ``HunyuanImagePipeline`` from a local release directory; the
adapter reuses the pipeline's pieces (Qwen2.5-VL + ByT5 glyph prompt encoding, latents,
VAE) and its guiders, and replaces its loop so that requests at different steps share one
transformer call. What it reproduces from ``HunyuanImagePipeline.__call__`` (diffusers
0.42):
- timesteps: sigmas linspace(1, 0, N + 1)[:-1] through the release's scheduler;
- prompts: the Qwen text is always padded to 1000 tokens and the ByT5 glyph text (what
  the prompt has in quotes) to 128, so every row of a call has the same text length and
  the group key is the latent grid alone;
- guidance is the release's guider (``guider/``, or ``ocr_guider/`` when the prompt has
  quoted text): AdaptiveProjectedMixGuidance runs CFG for the first steps and adaptive
  projected guidance after, with a momentum buffer carried from step to step. That state
  belongs to one request, so each request gets its own guider (``guider.new()``, with the
  request's ``guidance_scale`` if it sets one, which is how diffusers documents changing
  it); the guider also decides, per step, whether the negative-prompt rows run;
- the distilled release (``guidance_embeds``, no guiders) takes ``guidance_scale`` as its
  distilled guidance (x 1000, an embedding input) and, with ``use_meanflow``, the next
  timestep as ``timestep_r`` (0 at the last step).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

import omni.models.diffusion as common
from omni.engines.base import DenoiseJob

T2I = "HunyuanImagePipeline"
DISTILLED_GUIDANCE = 3.25  # the pipeline's default distilled_guidance_scale
# the transformer inputs a guider splits into conditional / unconditional batches
TEXT_INPUTS = ("encoder_hidden_states", "encoder_attention_mask", "encoder_hidden_states_2",
               "encoder_attention_mask_2")


def _classes() -> dict[str, Any]:
    from diffusers import HunyuanImagePipeline

    return {T2I: HunyuanImagePipeline}


def quiet_guiders() -> None:
    """Each request builds its guider; diffusers warns "experimental" on every one."""
    from diffusers.utils import logging

    logging.get_logger("diffusers.guiders.guider_utils").setLevel(logging.ERROR)


def guider_batches(job: DenoiseJob) -> list[Any]:
    """The request's guider's conditional (and, at this step, unconditional) input
    batches of ``job.state["inputs"]``; at step 0 this also starts its momentum buffer
    (the pipelines' loops do the same per step)."""
    guider = job.state["guider"]
    guider.set_state(step=job.step, num_inference_steps=job.steps,
                     timestep=job.timesteps[job.step])
    return guider.prepare_inputs(job.state["inputs"])


def flow_timesteps(pipe: Any, steps: int, device: str) -> tuple[Any, torch.Tensor]:
    """A per-request scheduler copy set to the Hunyuan pipelines' sigmas,
    linspace(1, 0, N + 1)[:-1]; (scheduler, timesteps)."""
    from diffusers.pipelines.hunyuan_image.pipeline_hunyuanimage import retrieve_timesteps

    scheduler = copy.deepcopy(pipe.scheduler)
    sigmas = np.linspace(1.0, 0.0, steps + 1)[:-1]
    timesteps, _ = retrieve_timesteps(scheduler, steps, device, sigmas=sigmas)
    scheduler.set_begin_index(0)
    return scheduler, timesteps


class HunyuanImageDenoiser:
    output = "image"
    OPTIONS = common.LIMIT_OPTIONS

    def __init__(self, pipe: Any, device: str, options: Mapping[str, Any]) -> None:
        """``pipe``: a loaded HunyuanImagePipeline on ``device``."""
        self.pipe = pipe
        self.device = device
        self.scale = pipe.vae_scale_factor
        config = pipe.transformer.config
        self.distilled = bool(config.guidance_embeds)
        self.meanflow = bool(config.use_meanflow)
        default_guidance = (DISTILLED_GUIDANCE if self.distilled or pipe.guider is None
                            else float(pipe.guider.config.guidance_scale))
        self.limits = common.limits(options, size_multiple=self.scale * 2,
                                    default_size="2048x2048", max_side=2048,
                                    default_steps=8 if self.distilled else 50,
                                    default_guidance=default_guidance)
        quiet_guiders()

    def info(self) -> dict[str, Any]:
        return {"tasks": ["generate"], "pipeline": type(self.pipe).__name__,
                "max_input_images": 0, **self.limits.info()}

    # -- requests ---------------------------------------------------------------------
    def plan(self, inputs: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
        if inputs.get("images"):
            raise ValueError("HunyuanImage 2.1 is a text-to-image model and takes no "
                             "input image")
        width, height = common.parse_size(params.get("size"), self.limits)
        plan = common.request_plan(inputs, params, self.limits, release_guidance=True)
        return plan | {"width": width, "height": height}

    @torch.inference_mode()
    def start(self, request_id: str, plan: dict[str, Any]) -> DenoiseJob:
        n = plan["n"]
        pos = self._encode(plan["prompt"], n)
        guider = self._guider(pos["encoder_hidden_states_2"], plan["guidance"])
        guided = bool(guider._enabled and guider.num_conditions > 1)  # as the pipeline
        neg = self._encode(plan["negative_prompt"], n) if guided else dict.fromkeys(pos)
        latents = self.pipe.prepare_latents(
            n, self.pipe.transformer.config.in_channels, plan["height"], plan["width"],
            pos["encoder_hidden_states"].dtype, self.device,
            common.generator(plan["seed"]))
        scheduler, timesteps = flow_timesteps(self.pipe, plan["steps"], self.device)
        distilled = plan["guidance"] if plan["guidance"] is not None else DISTILLED_GUIDANCE
        state = {"inputs": {k: (pos[k], neg[k]) for k in TEXT_INPUTS}, "guider": guider,
                 "distilled": distilled,
                 "tokens": int(pos["encoder_attention_mask"][0].sum())}
        return DenoiseJob(request_id, latents, timesteps, scheduler, rows=n, guided=guided,
                          seed=plan["seed"], state=state)

    def _encode(self, prompt: str | None, n: int) -> dict[str, torch.Tensor]:
        """The four text inputs of the transformer (None prompt: "", as the pipeline)."""
        encoded = self.pipe.encode_prompt(prompt=prompt, device=self.device,
                                          num_images_per_prompt=n)
        dtype = self.pipe.transformer.dtype
        text, mask, glyph, glyph_mask = encoded
        return dict(zip(TEXT_INPUTS, (text.to(dtype), mask, glyph.to(dtype), glyph_mask),
                        strict=True))

    def _guider(self, glyph: torch.Tensor, scale: float | None) -> Any:
        """This request's own guider: the OCR one for prompts with quoted text."""
        from diffusers import AdaptiveProjectedMixGuidance

        pipe = self.pipe
        base = pipe.ocr_guider if pipe.ocr_guider is not None and glyph.any() else pipe.guider
        if base is None:  # the distilled release: no guidance method, as the pipeline
            return AdaptiveProjectedMixGuidance(enabled=False)
        return base.new() if scale is None else base.new(guidance_scale=scale)

    # -- denoising --------------------------------------------------------------------
    def group_key(self, job: DenoiseJob) -> Any:
        return tuple(job.latents.shape[1:])

    @torch.inference_mode()
    def predict(self, jobs: list[DenoiseJob]) -> list[torch.Tensor]:
        batches = [(job, guider_batches(job)) for job in jobs]
        blocks = [(job, part) for job, parts in batches for part in parts]
        out = self.pipe.transformer(
            hidden_states=torch.cat([job.latents for job, _ in blocks]),
            timestep=torch.cat([self._timestep(job) for job, _ in blocks]),
            timestep_r=self._cat([self._timestep_r(job) for job, _ in blocks]),
            guidance=self._cat([self._guidance(job) for job, _ in blocks]),
            return_dict=False,
            **{k: torch.cat([getattr(part, k) for _, part in blocks]) for k in TEXT_INPUTS},
        )[0]
        for (_, part), pred in zip(blocks, out.split([job.rows for job, _ in blocks]),
                                   strict=True):
            part.noise_pred = pred
        return [job.state["guider"](parts)[0] for job, parts in batches]

    @staticmethod
    def _timestep(job: DenoiseJob) -> torch.Tensor:
        return job.timesteps[job.step].expand(job.rows).to(job.latents.dtype)

    def _timestep_r(self, job: DenoiseJob) -> torch.Tensor | None:
        if not self.meanflow:
            return None
        last = job.step == job.steps - 1
        t = torch.tensor([0.0], device=job.latents.device) if last else \
            job.timesteps[job.step + 1]
        return t.expand(job.rows).to(job.latents.dtype)

    def _guidance(self, job: DenoiseJob) -> torch.Tensor | None:
        if not self.distilled:
            return None
        # scale rounded to the model's dtype, then x 1000: the pipeline's order
        return torch.full((job.rows,), job.state["distilled"], device=job.latents.device,
                          dtype=self.pipe.transformer.dtype) * 1000.0

    @staticmethod
    def _cat(parts: list[torch.Tensor | None]) -> torch.Tensor | None:
        return None if parts[0] is None else torch.cat(parts)

    @torch.inference_mode()
    def decode(self, jobs: list[DenoiseJob]) -> list[dict[str, Any]]:
        pixels = self._pixels(torch.cat([job.latents for job in jobs]))
        return [{"images": images, "text_tokens": job.state["tokens"],
                 "image_tokens": int(job.latents[0, 0].numel()) * job.rows}
                for job, images in zip(jobs, pixels.split([j.rows for j in jobs]),
                                       strict=True)]

    @torch.inference_mode()
    def preview(self, job: DenoiseJob) -> dict[str, Any]:
        """The flow-matching estimate of the clean latents, x0 = x_t - sigma_t * v."""
        sigma = job.scheduler.sigmas[job.step].to(job.latents)
        return {"preview": self._pixels(job.latents - sigma * job.last_output)}

    def _pixels(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipe.vae
        latents = latents.to(vae.dtype) / vae.config.scaling_factor
        return common.to_uint8(vae.decode(latents, return_dict=False)[0])


def build_hunyuan_image(*, model_dir: str, device: str, dtype: str,
                        options: Mapping[str, Any]) -> HunyuanImageDenoiser:
    pipe = common.load_pipeline(model_dir, _classes(), device=device, dtype=dtype,
                                load_format=common.load_format(options))
    return HunyuanImageDenoiser(pipe, device, options)
