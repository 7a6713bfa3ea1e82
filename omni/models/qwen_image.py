"""Qwen-Image (text to image) and Qwen-Image-Edit for the diffusion engine.

Loaded with diffusers' own pipeline classes from a local release directory; this adapter
reuses the pipeline's pieces (prompt encoding, latent packing, timesteps, VAE) and
replaces only its loop, so that requests at different steps share one transformer call.
What it reproduces from ``QwenImagePipeline.__call__`` (diffusers 0.42):
- timesteps: sigmas linspace(1, 1/N, N) shifted by ``mu`` from the image's token count;
- guidance ("true CFG") runs only with a negative prompt and guidance_scale > 1, and
  rescales the combined prediction to the conditional one's norm per token;
- the transformer takes timestep / 1000 and, per row, the image grid in ``img_shapes``.
Edit: the prompt is encoded together with the input image by the VL text encoder, the
input image's latents ride after the noise latents in the sequence (their output is
dropped), and the input is resized to ``edit_area`` pixels at its own aspect ratio.

Batching rows of different prompt lengths pads the text with a mask, as diffusers does
for a list of prompts; rows of one call must share the image grid (the group key).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

import omni.models.diffusion as common
from omni.engines.base import DenoiseJob

T2I, EDIT = "QwenImagePipeline", "QwenImageEditPipeline"


def _classes() -> dict[str, Any]:
    from diffusers import QwenImageEditPipeline, QwenImagePipeline

    return {T2I: QwenImagePipeline, EDIT: QwenImageEditPipeline}


def load_vl_processor(path: str) -> Any:
    """Qwen-Image-Edit's Qwen2-VL processor. transformers 5 cannot build
    ``Qwen2VLProcessor`` without torchvision (its video processor needs it), and no CPU
    torchvision matches torch 2.13 on PyPI; the edit pipeline never uses the video
    processor, so without torchvision the same class is built without it."""
    import importlib.util

    from transformers import Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin

    if importlib.util.find_spec("torchvision") is not None:
        return Qwen2VLProcessor.from_pretrained(path)

    class Qwen2VLImageOnlyProcessor(Qwen2VLProcessor):
        def __init__(self, image_processor: Any = None, tokenizer: Any = None,
                     chat_template: Any = None, **kwargs: Any) -> None:
            self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer,
                                    chat_template=chat_template)

    return Qwen2VLImageOnlyProcessor.from_pretrained(path)


class QwenImageDenoiser:
    output = "image"
    OPTIONS = common.LIMIT_OPTIONS | {"edit_area", "max_sequence_length"}

    def __init__(self, pipe: Any, device: str, options: Mapping[str, Any]) -> None:
        """``pipe``: a loaded QwenImagePipeline or QwenImageEditPipeline on ``device``."""
        self.pipe = pipe
        self.device = device
        self.edit = type(self.pipe).__name__ == EDIT
        self.scale = self.pipe.vae_scale_factor
        self.limits = common.limits(options, size_multiple=self.scale * 2)
        self.edit_area = int(options.get("edit_area", 1024 * 1024))
        self.max_text_tokens = int(options.get("max_sequence_length", 512))

    def info(self) -> dict[str, Any]:
        return {"tasks": ["edit"] if self.edit else ["generate"],
                "pipeline": type(self.pipe).__name__,
                "max_input_images": 1, **self.limits.info()}

    # -- requests ---------------------------------------------------------------------
    def plan(self, inputs: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
        image = common.edit_image(inputs.get("images") or [], self.edit, "Qwen-Image-Edit")
        plan = common.request_plan(inputs, params, self.limits) | {"image": image}
        size = params.get("size")
        if image is not None and size in (None, "auto"):
            plan["width"], plan["height"] = self._edit_dims(image)
        else:
            plan["width"], plan["height"] = common.parse_size(size, self.limits)
        return plan

    def _edit_dims(self, image: Any) -> tuple[int, int]:
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions

        width, height, _ = calculate_dimensions(self.edit_area, image.size[0] / image.size[1])
        m = self.scale * 2
        return width // m * m, height // m * m

    @torch.inference_mode()
    def start(self, request_id: str, plan: dict[str, Any]) -> DenoiseJob:
        pipe, n = self.pipe, plan["n"]
        guided = plan["guidance"] > 1 and plan["negative_prompt"] is not None
        image, prompt_image, cond_dims = self._edit_input(plan)
        pos, pos_mask = self._encode(plan["prompt"], prompt_image, n)
        neg = self._encode(plan["negative_prompt"], prompt_image, n) if guided else (None, None)
        channels = pipe.transformer.config.in_channels // 4
        gen = common.generator(plan["seed"])
        args = (n, channels, plan["height"], plan["width"], pos.dtype, self.device, gen)
        if self.edit:
            latents, image_latents = pipe.prepare_latents(image, *args)
        else:
            latents, image_latents = pipe.prepare_latents(*args), None
        grid = [(1, plan["height"] // self.scale // 2, plan["width"] // self.scale // 2)]
        if self.edit:
            grid.append((1, cond_dims[1] // self.scale // 2, cond_dims[0] // self.scale // 2))
        scheduler, timesteps = self._timesteps(plan["steps"], latents.shape[1])
        return DenoiseJob(request_id, latents, timesteps, scheduler, rows=n, guided=guided,
                          seed=plan["seed"],
                          state={"pos": pos, "pos_mask": pos_mask, "neg": neg[0],
                                 "neg_mask": neg[1], "grid": tuple(grid),
                                 "image_latents": image_latents, "scale": plan["guidance"],
                                 "tokens": _tokens(pos, pos_mask),
                                 "width": plan["width"], "height": plan["height"]})

    def _edit_input(self, plan: dict[str, Any]) -> tuple[Any, Any, tuple[int, int] | None]:
        """Edit: (the VAE input, the image the text encoder sees, its (w, h))."""
        if not self.edit:
            return None, None, None
        width, height = self._edit_dims(plan["image"])
        processor = self.pipe.image_processor
        prompt_image = processor.resize(plan["image"], height, width)
        image = processor.preprocess(prompt_image, height, width).unsqueeze(2)
        return image.to(self.device), prompt_image, (width, height)

    def _encode(self, prompt: str, image: Any, n: int) -> tuple[torch.Tensor, Any]:
        kwargs = {"image": image} if self.edit else {}
        return self.pipe.encode_prompt(prompt=prompt, device=self.device,
                                       num_images_per_prompt=n,
                                       max_sequence_length=self.max_text_tokens, **kwargs)

    def _timesteps(self, steps: int, image_tokens: int) -> tuple[Any, torch.Tensor]:
        from diffusers.pipelines.qwenimage.pipeline_qwenimage import (
            calculate_shift,
            retrieve_timesteps,
        )

        scheduler = copy.deepcopy(self.pipe.scheduler)
        cfg = scheduler.config
        mu = calculate_shift(image_tokens, cfg.get("base_image_seq_len", 256),
                             cfg.get("max_image_seq_len", 4096), cfg.get("base_shift", 0.5),
                             cfg.get("max_shift", 1.15))
        sigmas = np.linspace(1.0, 1 / steps, steps)
        timesteps, _ = retrieve_timesteps(scheduler, steps, self.device, sigmas=sigmas, mu=mu)
        scheduler.set_begin_index(0)
        return scheduler, timesteps

    # -- denoising --------------------------------------------------------------------
    def group_key(self, job: DenoiseJob) -> Any:
        return job.state["grid"]

    @torch.inference_mode()
    def predict(self, jobs: list[DenoiseJob]) -> list[torch.Tensor]:
        blocks = []  # (job, latents, text, mask) per row block: conditional, then guided
        for job in jobs:
            blocks.append((job, job.state["pos"], job.state["pos_mask"]))
        for job in jobs:
            if job.guided:
                blocks.append((job, job.state["neg"], job.state["neg_mask"]))
        text, mask = _pad_text([(t, m) for _, t, m in blocks])
        x = torch.cat([common.with_image_latents(job) for job, _, _ in blocks])
        t = torch.cat([job.timesteps[job.step].expand(job.rows) for job, _, _ in blocks])
        out = self.pipe.transformer(hidden_states=x, timestep=t.to(x.dtype) / 1000,
                                    guidance=None, encoder_hidden_states_mask=mask,
                                    encoder_hidden_states=text,
                                    img_shapes=[list(blocks[0][0].state["grid"])] * len(x),
                                    return_dict=False)[0]
        per_block = out.split([job.rows for job, _, _ in blocks])
        cond = {id(job): p[:, :job.latents.shape[1]] for (job, _, _), p in
                zip(blocks[:len(jobs)], per_block[:len(jobs)], strict=True)}
        uncond = {id(job): p[:, :job.latents.shape[1]] for (job, _, _), p in
                  zip(blocks[len(jobs):], per_block[len(jobs):], strict=True)}
        return [_true_cfg(cond[id(j)], uncond.get(id(j)), j.state["scale"]) for j in jobs]

    @torch.inference_mode()
    def decode(self, jobs: list[DenoiseJob]) -> list[dict[str, Any]]:
        pixels = self._pixels(jobs[0], torch.cat([job.latents for job in jobs]))
        return [{"images": images, "text_tokens": job.state["tokens"],
                 "image_tokens": int(job.latents.shape[1]) * job.rows}
                for job, images in zip(jobs, pixels.split([j.rows for j in jobs]),
                                       strict=True)]

    @torch.inference_mode()
    def preview(self, job: DenoiseJob) -> dict[str, Any]:
        return common.flow_preview(job, self._pixels)

    def _pixels(self, job: DenoiseJob, packed: torch.Tensor) -> torch.Tensor:
        vae = self.pipe.vae
        latents = self.pipe._unpack_latents(packed, job.state["height"], job.state["width"],
                                            self.scale).to(vae.dtype)
        shape = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents)
        std = torch.tensor(vae.config.latents_std).view(shape).to(latents)
        pixels = vae.decode(latents * std + mean, return_dict=False)[0][:, :, 0]
        return common.to_uint8(pixels)


def _pad_text(blocks: list[tuple[torch.Tensor, Any]]) -> tuple[torch.Tensor, Any]:
    """Row blocks of text embeddings (rows, L_i, D) -> one right-padded batch + mask
    (None when nothing is padded, which is what diffusers passes then)."""
    longest = max(t.shape[1] for t, _ in blocks)
    texts, masks = [], []
    for text, mask in blocks:
        rows, length, _ = text.shape
        if mask is None:
            mask = torch.ones(rows, length, dtype=torch.long, device=text.device)
        texts.append(torch.nn.functional.pad(text, (0, 0, 0, longest - length)))
        masks.append(torch.nn.functional.pad(mask, (0, longest - length)))
    mask = torch.cat(masks)
    return torch.cat(texts), (None if bool(mask.all()) else mask)


def _tokens(text: torch.Tensor, mask: Any) -> int:
    """Prompt tokens (after the template's dropped prefix) of one row."""
    return int(mask[0].sum()) if mask is not None else int(text.shape[1])


def _true_cfg(cond: torch.Tensor, uncond: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Qwen-Image's guidance: combine, then rescale to the conditional norm per token."""
    if uncond is None:
        return cond
    combined = uncond + scale * (cond - uncond)
    return combined * (cond.norm(dim=-1, keepdim=True) / combined.norm(dim=-1, keepdim=True))


def build_qwen_image(*, model_dir: str, device: str, dtype: str,
                     options: Mapping[str, Any]) -> QwenImageDenoiser:
    extra = {}
    if common.pipeline_class(model_dir) == EDIT:
        extra["processor"] = load_vl_processor(f"{model_dir}/processor")
    pipe = common.load_pipeline(model_dir, _classes(), device=device, dtype=dtype,
                                load_format=common.load_format(options), **extra)
    return QwenImageDenoiser(pipe, device, options)
