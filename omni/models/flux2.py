"""FLUX.2 (text to image, and edits from reference images) for the diffusion engine.

Loaded with diffusers' ``Flux2Pipeline`` from a local release directory; the adapter
reuses the pipeline's pieces (Mistral-Small prompt encoding, latent patchify/pack, the
4-axis position ids, reference-image latents, timesteps, the VAE's batch-norm
statistics) and replaces its loop so that requests at different steps share one
transformer call. What it reproduces from ``Flux2Pipeline.__call__`` (diffusers 0.42):
- timesteps: sigmas linspace(1, 1/N, N) with the pipeline's empirical ``mu`` (it depends
  on the token count and on N);
- ``guidance_scale`` is distilled guidance, one value per row (no negative pass: the
  pipeline has no negative prompt, so a request with one is refused);
- the prompt is padded to ``max_sequence_length`` tokens, so rows share text positions;
  the transformer takes the first row's position ids for the whole call, so the group
  key is the whole id layout: the output grid and every reference image's grid;
- edits: reference images (``max_input_images``, default 4) are checked as the pipeline
  checks them (sides >= 64 px, aspect <= 8), shrunk to at most 1024x1024 pixels, cropped
  to the 16-pixel grid, VAE-encoded and packed after the noise latents with their own
  time coordinate; ``size: auto`` is the first image's size.

The release's tokenizer/ is a PixtralProcessor; transformers builds that class only with
torchvision, and prompt encoding uses only its tokenizer and chat template, so without
torchvision the folder's tokenizer is loaded alone.
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

import omni.models.diffusion as common
from omni.engines.base import DenoiseJob
from omni.models.flux import decode_by_size

PIPELINE = "Flux2Pipeline"
MAX_REFERENCE_AREA = 1024 * 1024  # the pipeline shrinks larger reference images to this


def _classes() -> dict[str, Any]:
    from diffusers import Flux2Pipeline

    return {PIPELINE: Flux2Pipeline}


class Flux2Denoiser:
    output = "image"
    OPTIONS = common.LIMIT_OPTIONS | {"max_sequence_length", "max_input_images"}

    def __init__(self, pipe: Any, device: str, options: Mapping[str, Any]) -> None:
        """``pipe``: a loaded Flux2Pipeline on ``device``."""
        self.pipe = pipe
        self.device = device
        self.scale = pipe.vae_scale_factor
        self.limits = common.limits(options, size_multiple=self.scale * 2, default_steps=50,
                                    default_guidance=4.0)
        self.max_text_tokens = int(options.get("max_sequence_length", 512))
        self.max_images = int(options.get("max_input_images", 4))

    def info(self) -> dict[str, Any]:
        return {"tasks": ["generate", "edit"], "pipeline": type(self.pipe).__name__,
                "max_input_images": self.max_images, **self.limits.info()}

    # -- requests ---------------------------------------------------------------------
    def plan(self, inputs: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
        if inputs.get("negative_prompt"):
            raise ValueError("FLUX.2 takes no 'negative_prompt' (its guidance is distilled)")
        images = inputs.get("images") or []
        if len(images) > self.max_images:
            raise ValueError(f"this model takes at most {self.max_images} reference images")
        plan = common.request_plan(inputs, params, self.limits)
        plan["images"] = [self._reference(common.open_image(data)) for data in images]
        size = params.get("size")
        if plan["images"] and size in (None, "auto"):
            height, width = plan["images"][0].shape[-2:]
            size = f"{width}x{height}"
        plan["width"], plan["height"] = common.parse_size(size, self.limits)
        return plan

    def _reference(self, image: Any) -> Any:
        """A reference image as the pipeline takes it: checked, shrunk, on the grid."""
        processor = self.pipe.image_processor
        processor.check_image_input(image)  # ValueError: too small, too narrow
        if image.size[0] * image.size[1] > MAX_REFERENCE_AREA:
            image = processor._resize_to_target_area(image, MAX_REFERENCE_AREA)
        m = self.scale * 2
        width, height = image.size[0] // m * m, image.size[1] // m * m
        return processor.preprocess(image, height=height, width=width, resize_mode="crop")

    @torch.inference_mode()
    def start(self, request_id: str, plan: dict[str, Any]) -> DenoiseJob:
        pipe, n = self.pipe, plan["n"]
        text, text_ids = pipe.encode_prompt(prompt=plan["prompt"], device=self.device,
                                            num_images_per_prompt=n,
                                            max_sequence_length=self.max_text_tokens)
        gen = common.generator(plan["seed"])
        latents, ids = pipe.prepare_latents(n, pipe.transformer.config.in_channels // 4,
                                            plan["height"], plan["width"], text.dtype,
                                            self.device, gen)
        image_latents = None
        if plan["images"]:
            image_latents, image_ids = pipe.prepare_image_latents(
                images=plan["images"], batch_size=n, generator=gen, device=self.device,
                dtype=pipe.vae.dtype)
            ids = torch.cat([ids, image_ids], dim=1)
        scheduler, timesteps = self._timesteps(plan["steps"], latents.shape[1])
        grid = (plan["height"], plan["width"],
                *(tuple(image.shape[-2:]) for image in plan["images"]))
        state = {"text": text, "text_ids": text_ids, "ids": ids, "grid": grid,
                 "image_latents": image_latents, "guidance": plan["guidance"],
                 "tokens": self._prompt_tokens(plan["prompt"])}
        return DenoiseJob(request_id, latents, timesteps, scheduler, rows=n, guided=False,
                          seed=plan["seed"], state=state)

    def _prompt_tokens(self, prompt: str) -> int:
        """The user prompt's own tokens (the usage count; the model sees the template)."""
        return len(self.pipe.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def _timesteps(self, steps: int, image_tokens: int) -> tuple[Any, torch.Tensor]:
        from diffusers.pipelines.flux2.pipeline_flux2 import (
            compute_empirical_mu,
            retrieve_timesteps,
        )

        scheduler = copy.deepcopy(self.pipe.scheduler)
        sigmas = (None if scheduler.config.get("use_flow_sigmas")
                  else np.linspace(1.0, 1 / steps, steps))
        mu = compute_empirical_mu(image_seq_len=image_tokens, num_steps=steps)
        timesteps, _ = retrieve_timesteps(scheduler, steps, self.device, sigmas=sigmas, mu=mu)
        scheduler.set_begin_index(0)
        return scheduler, timesteps

    # -- denoising --------------------------------------------------------------------
    def group_key(self, job: DenoiseJob) -> Any:
        return job.state["grid"]

    @torch.inference_mode()
    def predict(self, jobs: list[DenoiseJob]) -> list[torch.Tensor]:
        model = self.pipe.transformer
        x = torch.cat([common.with_image_latents(job) for job in jobs]).to(model.dtype)
        t = torch.cat([job.timesteps[job.step].expand(job.rows) for job in jobs])
        guidance = torch.cat([torch.full((job.rows,), job.state["guidance"],
                                         device=x.device, dtype=torch.float32)
                              for job in jobs])
        out = model(hidden_states=x, timestep=t.to(jobs[0].latents.dtype) / 1000,
                    guidance=guidance,
                    encoder_hidden_states=torch.cat([job.state["text"] for job in jobs]),
                    txt_ids=torch.cat([job.state["text_ids"] for job in jobs]),
                    img_ids=torch.cat([job.state["ids"] for job in jobs]),
                    return_dict=False)[0]
        return [part[:, :job.latents.shape[1]]
                for job, part in zip(jobs, out.split([j.rows for j in jobs]), strict=True)]

    @torch.inference_mode()
    def decode(self, jobs: list[DenoiseJob]) -> list[dict[str, Any]]:
        return decode_by_size(jobs, self._pixels)

    @torch.inference_mode()
    def preview(self, job: DenoiseJob) -> dict[str, Any]:
        return common.flow_preview(job, self._pixels)

    def _pixels(self, job: DenoiseJob, packed: torch.Tensor) -> torch.Tensor:
        pipe, vae = self.pipe, self.pipe.vae
        rows = packed.shape[0]
        ids = job.state["ids"][:1, :packed.shape[1]].expand(rows, -1, -1)
        latents = pipe._unpack_latents_with_ids(packed, ids)
        mean = vae.bn.running_mean.view(1, -1, 1, 1).to(latents)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1)
                         + vae.config.batch_norm_eps).to(latents)
        latents = pipe._unpatchify_latents(latents * std + mean)
        return common.to_uint8(vae.decode(latents.to(vae.dtype), return_dict=False)[0])


def load_text_tokenizer(path: str) -> Any:
    """The tokenizer of the release's PixtralProcessor folder (see module docstring)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def build_flux2(*, model_dir: str, device: str, dtype: str,
                options: Mapping[str, Any]) -> Flux2Denoiser:
    load_format = common.load_format(options)
    if importlib.util.find_spec("torchvision") is not None:
        pipe = common.load_pipeline(model_dir, _classes(), device=device, dtype=dtype,
                                    load_format=load_format)
    else:  # diffusers refuses a stand-in for the processor: load without it, then add it
        pipe = common.load_pipeline(model_dir, _classes(), device=device, dtype=dtype,
                                    load_format=load_format, tokenizer=None)
        pipe.register_modules(tokenizer=load_text_tokenizer(f"{model_dir}/tokenizer"))
    return Flux2Denoiser(pipe, device, options)
