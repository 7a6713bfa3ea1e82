"""LTX-2 image to video: the input image is latent frame 0, as diffusers 0.42's
``LTX2ImageToVideoPipeline.__call__`` conditions it.

- the image is re-compressed as one H.264 frame at ``image_crf`` (the CRF the model was
  trained against: 33 up to LTX-2.3, 18 for LTX-2.5's Gemma-4 encoder; 0 skips it), then
  resized bilinearly to the request's size and normalized by the I2V pipeline's video
  processor;
- the video VAE encodes it (the distribution's mode: no noise drawn), normalized, as
  every latent frame; frame 0 keeps it (``conditioning_mask`` = 1 there) and the others
  take the request's noise, drawn exactly as text to video draws it;
- frame 0's tokens get timestep 0 (``t * (1 - mask)`` per video token; audio and the
  LTX-2.3 prompt modulation keep ``t``), and the video scheduler never steps them
  (``JointScheduler``'s ``held`` tokens).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

import omni.models.diffusion as common
from omni.engines.base import DenoiseJob, EngineLoadError


class FirstFrame:
    """Builds an image request's first-frame latents with the I2V pipeline's own pieces
    (its video processor resamples bilinearly, the T2V one bicubically)."""

    def __init__(self, pipe: Any, options: Mapping[str, Any]) -> None:
        from diffusers import LTX2ImageToVideoPipeline
        from diffusers.pipelines.ltx2.utils import resolve_default_image_crf

        self.pipe = LTX2ImageToVideoPipeline(**pipe.components)
        self.pipe.set_progress_bar_config(disable=True)
        try:
            self.crf = int(options.get("image_crf", resolve_default_image_crf(
                pipe.text_encoder)))
        except (TypeError, ValueError) as e:
            raise EngineLoadError(f"'image_crf' must be an integer: {e}") from e
        if not 0 <= self.crf <= 51:
            raise EngineLoadError("'image_crf' must be from 0 (off) to 51 (H.264's range)")

    def image(self, data: Any) -> Any:
        """The request's input_reference as an RGB PIL image; ValueError when it cannot
        be one (H.264 needs 2x2 pixels at least; the pipeline fails on less)."""
        image = common.open_image(data, "input_reference")
        if self.crf and min(image.size) < 2:
            raise ValueError(f"'input_reference' must be at least 2x2 pixels, got "
                             f"{image.width}x{image.height}")
        return image

    def latents(self, image: Any, plan: Mapping[str, Any], generator: torch.Generator,
                device: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(packed latents (1, tokens, C) with the image as frame 0 and noise elsewhere,
        the conditioning mask (1, tokens): 1 on frame 0's tokens)."""
        from diffusers.pipelines.ltx2.utils import apply_image_conditioning_crf
        from PIL import Image

        pipe = self.pipe
        if self.crf:
            image = Image.fromarray(apply_image_conditioning_crf(np.array(image), self.crf))
        pixels = pipe.video_processor.preprocess(image, height=plan["height"],
                                                 width=plan["width"])
        return pipe.prepare_latents(
            pixels.to(device, dtype=pipe.vae.dtype), 1, pipe.transformer.config.in_channels,
            plan["height"], plan["width"], plan["frames"], 0.0, torch.float32, device,
            generator)


def video_timesteps(jobs: list[DenoiseJob], timestep: torch.Tensor) -> torch.Tensor:
    """The video timestep of one transformer call: ``timestep`` (rows,) as it is when no
    row holds an image, else (rows, video tokens) with 0 on each image's frame-0 tokens
    (text rows repeat their t on every token, so both kinds share the call)."""
    masks = [job.state.get("first_frame") for job in jobs]
    if all(mask is None for mask in masks):
        return timestep
    tokens = jobs[0].state["streams"].video[0]
    return torch.stack([t.expand(tokens) if mask is None else t * (1 - mask[0])
                        for t, mask in zip(timestep, masks, strict=True)])
