"""HunyuanVideo 1.5 text-to-video and image-to-video for the diffusion engine.

Loaded with diffusers' ``HunyuanVideo15Pipeline`` / ``HunyuanVideo15ImageToVideoPipeline``
from a local release directory; the adapter reuses the pipeline's pieces (Qwen2.5-VL chat
prompt + ByT5 glyph encoding, SigLIP image encoding, latents, the condition latents and
mask, VAE) and its guider, and replaces its loop so that requests at different steps
share one transformer call. What it reproduces from the pipelines' ``__call__``
(diffusers 0.42):
- frames: the VAE compresses time 4x, so a video has 4k+1 frames (121 by default, at
  24 fps); sizes are multiples of the VAE's 16x; the default size is the pipeline's own
  16:9 bucket for the release's ``target_size`` (848x480 for the 480p releases);
- timesteps: sigmas linspace(1, 0, N + 1)[:-1] through the release's scheduler;
- the transformer input is [latents, condition latents, mask] on the channel axis, plus
  729 image tokens: zeros for text-to-video; for image-to-video the reference image
  (resized and centre-cropped to the bucket nearest its aspect ratio, which is the video
  size, as the pipeline does) is VAE-encoded as the first latent frame of the condition,
  the mask marks that frame, and SigLIP encodes the image tokens;
- guidance is the release's guider (ClassifierFreeGuidance), one per request
  (``guider.new()``, with the request's ``guidance_scale`` if it sets one), which also
  decides per step whether the negative-prompt rows run; the negative prompt defaults to
  "" as in diffusers;
- prompts are padded to 1000 Qwen and 256 ByT5 tokens, so the group key is the latent
  shape alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

import omni.models.diffusion as common
from omni.engines.base import DenoiseJob, EngineLoadError
from omni.models.hunyuan_image import TEXT_INPUTS, flow_timesteps, guider_batches, quiet_guiders

T2V, I2V = "HunyuanVideo15Pipeline", "HunyuanVideo15ImageToVideoPipeline"
FPS = 24  # HunyuanVideo 1.5 renders 24 fps


def _classes() -> dict[str, Any]:
    from diffusers import HunyuanVideo15ImageToVideoPipeline, HunyuanVideo15Pipeline

    return {T2V: HunyuanVideo15Pipeline, I2V: HunyuanVideo15ImageToVideoPipeline}


class HunyuanVideoDenoiser:
    output = "video"
    OPTIONS = common.LIMIT_OPTIONS

    def __init__(self, pipe: Any, device: str, options: Mapping[str, Any]) -> None:
        """``pipe``: a loaded HunyuanVideo15(ImageToVideo)Pipeline on ``device``."""
        self.pipe = pipe
        self.device = device
        self.i2v = type(pipe).__name__ == I2V
        self.temporal = pipe.vae_scale_factor_temporal
        self.spatial = pipe.vae_scale_factor_spatial * pipe.transformer.config.patch_size
        self.dtype = pipe.transformer.dtype
        height, width = self._bucket(9, 16)
        self.limits = common.limits(
            options, size_multiple=self.spatial, default_size=f"{width}x{height}",
            max_pixels=1280 * 720, max_side=1280, default_steps=50, max_n=1,
            default_guidance=float(pipe.guider.config.guidance_scale), fps=FPS,
            default_frames=121, max_frames=121)
        if (self.limits.max_frames - 1) % self.temporal:
            raise EngineLoadError(f"max_frames must be {self.temporal}k+1")
        quiet_guiders()

    def info(self) -> dict[str, Any]:
        return {"tasks": ["image_to_video"] if self.i2v else ["text_to_video"],
                "pipeline": type(self.pipe).__name__, "max_input_images": int(self.i2v),
                "frame_step": self.temporal, **self.limits.info()}

    def _bucket(self, height: int, width: int) -> tuple[int, int]:
        """The release's (height, width) bucket nearest this aspect ratio."""
        return self.pipe.video_processor.calculate_default_height_width(
            height, width, self.pipe.target_size)

    # -- requests ---------------------------------------------------------------------
    def plan(self, inputs: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
        images = inputs.get("images") or []
        if self.i2v and not images:
            raise ValueError("this is an image-to-video model: send 'input_reference' "
                             "(the first frame)")
        if images and not self.i2v:
            raise ValueError("this is a text-to-video model and takes no 'input_reference'; "
                             "HunyuanVideo 1.5 I2V releases can")
        if len(images) > 1:
            raise ValueError("one reference image per video")
        frames = common.video_frames(params, self.limits, self.temporal)
        image = common.open_image(images[0], "input_reference") if images else None
        width, height = self._size(params.get("size"), image)
        plan = common.request_plan(inputs, params, self.limits, release_guidance=True)
        return plan | {"frames": frames, "width": width, "height": height, "image": image}

    def _size(self, size: Any, image: Any) -> tuple[int, int]:
        """(width, height): the request's, or for image-to-video the image's bucket."""
        if image is None:
            return common.parse_size(size, self.limits)
        height, width = self._bucket(image.size[1], image.size[0])
        if size not in (None, "auto", f"{width}x{height}"):
            raise ValueError(f"'size' is set by the input_reference's aspect ratio here: "
                             f"{width}x{height} (send that, 'auto' or none)")
        return width, height

    @torch.inference_mode()
    def start(self, request_id: str, plan: dict[str, Any]) -> DenoiseJob:
        pipe, n = self.pipe, plan["n"]
        pos = self._encode(plan["prompt"], n)
        base = pipe.guider
        guider = base.new() if plan["guidance"] is None else base.new(
            guidance_scale=plan["guidance"])
        guided = bool(guider._enabled and guider.num_conditions > 1)  # as the pipeline
        neg = self._encode(plan["negative_prompt"], n) if guided else dict.fromkeys(pos)
        latents = pipe.prepare_latents(n, pipe.num_channels_latents, plan["height"],
                                       plan["width"], plan["frames"], self.dtype, self.device,
                                       common.generator(plan["seed"]))
        condition, mask, image_embeds = self._condition(latents, plan)
        scheduler, timesteps = flow_timesteps(pipe, plan["steps"], self.device)
        state = {"inputs": {k: (pos[k], neg[k]) for k in TEXT_INPUTS}, "guider": guider,
                 "condition": torch.cat([condition, mask], 1), "image_embeds": image_embeds}
        return DenoiseJob(request_id, latents, timesteps, scheduler, rows=n, guided=guided,
                          seed=plan["seed"], state=state)

    def _encode(self, prompt: str | None, n: int) -> dict[str, torch.Tensor]:
        """The four text inputs of the transformer (None prompt: "", as the pipeline)."""
        encoded = self.pipe.encode_prompt(prompt=prompt, device=self.device, dtype=self.dtype,
                                          num_videos_per_prompt=n)
        return dict(zip(TEXT_INPUTS, encoded, strict=True))

    def _condition(self, latents: torch.Tensor, plan: dict[str, Any]) -> tuple[Any, Any, Any]:
        """(condition latents, mask, image tokens): zeros for text-to-video."""
        pipe, n = self.pipe, plan["n"]
        if plan["image"] is None:
            condition, mask = pipe.prepare_cond_latents_and_mask(latents, self.dtype,
                                                                 self.device)
            embeds = torch.zeros(n, pipe.vision_num_semantic_tokens, pipe.vision_states_dim,
                                 dtype=self.dtype, device=self.device)
            return condition, mask, embeds
        height, width = plan["height"], plan["width"]
        image = pipe.video_processor.resize(plan["image"], height=height, width=width,
                                            resize_mode="crop")
        embeds = pipe.encode_image(image=image, batch_size=n, device=self.device,
                                   dtype=self.dtype)
        condition, mask = pipe.prepare_cond_latents_and_mask(
            latents=latents, image=image, batch_size=n, height=height, width=width,
            dtype=self.dtype, device=self.device)
        return condition, mask, embeds

    # -- denoising --------------------------------------------------------------------
    def group_key(self, job: DenoiseJob) -> Any:
        return tuple(job.latents.shape[1:])

    @torch.inference_mode()
    def predict(self, jobs: list[DenoiseJob]) -> list[torch.Tensor]:
        batches = [(job, guider_batches(job)) for job in jobs]
        blocks = [(job, part) for job, parts in batches for part in parts]
        x = torch.cat([torch.cat([job.latents, job.state["condition"]], 1)
                       for job, _ in blocks])
        out = self.pipe.transformer(
            hidden_states=x,
            timestep=torch.cat([job.timesteps[job.step].expand(job.rows) for job, _ in blocks]
                               ).to(x.dtype),
            image_embeds=torch.cat([job.state["image_embeds"] for job, _ in blocks]),
            return_dict=False,
            **{k: torch.cat([getattr(part, k) for _, part in blocks]) for k in TEXT_INPUTS},
        )[0]
        for (_, part), pred in zip(blocks, out.split([job.rows for job, _ in blocks]),
                                   strict=True):
            part.noise_pred = pred
        return [job.state["guider"](parts)[0] for job, parts in batches]

    @torch.inference_mode()
    def decode(self, jobs: list[DenoiseJob]) -> list[dict[str, Any]]:
        # one video per VAE call: the VAE's causal attention mask does not broadcast over
        # a batch (diffusers 0.42, AutoencoderKLHunyuanVideo15's mid-block attention)
        return [{"video": self._frames(job.latents[i:i + 1])[0], "fps": self.limits.fps}
                for job in jobs for i in range(job.rows)]

    def _frames(self, latents: torch.Tensor) -> torch.Tensor:
        """(1, C, f, h, w) latents -> uint8 (1, F, H, W, 3) frames."""
        vae = self.pipe.vae
        video = vae.decode(latents.to(vae.dtype) / vae.config.scaling_factor,
                           return_dict=False)[0]
        return common.to_uint8(video.movedim(1, 2))


def build_hunyuan_video(*, model_dir: str, device: str, dtype: str,
                        options: Mapping[str, Any]) -> HunyuanVideoDenoiser:
    pipe = common.load_pipeline(model_dir, _classes(), device=device, dtype=dtype,
                                load_format=common.load_format(options))
    return HunyuanVideoDenoiser(pipe, device, options)
