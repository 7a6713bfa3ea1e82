"""What the diffusers adapters (qwen_image.py, wan.py, flux.py, ...) share: loading a
pipeline directory, request limits, seeds, reference images, and the packed-latent
pieces of the flow-matching image models (the input image's latents, previews).

Request limits live in diffusion_limits.py (no torch: the API checks them too).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from omni.engines.base import DenoiseJob, EngineLoadError
from omni.models.diffusion_limits import (  # noqa: F401  (the adapters' one import)
    LIMIT_OPTIONS,
    Limits,
    LimitsError,
    bounded_int,
    guidance,
    parse_size,
    seed_of,
)
from omni.models.dummy_weights import random_components, wants_dummy

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def pipeline_class(model_dir: str | Path) -> str:
    """``_class_name`` of a diffusers directory's model_index.json."""
    index = Path(model_dir) / "model_index.json"
    try:
        return str(json.loads(index.read_text())["_class_name"])
    except (OSError, ValueError, KeyError) as e:
        raise EngineLoadError(f"{model_dir} is not a diffusers pipeline directory "
                              f"(model_index.json: {e})") from e


def torch_dtype(dtype: str, device: str) -> torch.dtype:
    """'auto' is bf16 on CUDA (what the releases are trained in) and fp32 on CPU."""
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype not in DTYPES:
        raise EngineLoadError(f"dtype {dtype!r} is not one of auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def load_format(options: Mapping[str, Any]) -> Any:
    """The stage's option ``load_format``: auto (the weights on disk, the default; null
    too) or dummy (random weights, dummy_weights.py); load_pipeline checks the value."""
    value = options.get("load_format")
    return "auto" if value is None else value


def load_pipeline(model_dir: str, classes: Mapping[str, Any], *, device: str,
                  dtype: str, load_format: str = "auto", **components: Any) -> Any:
    """The whole pipeline, every component loaded through its own class from its own
    folder (diffusers' from_pretrained reads model_index.json), on ``device``;
    ``components`` are ones the adapter loaded itself. ``load_format`` dummy: the model
    components it did not are built from their configs with random weights instead."""
    name = pipeline_class(model_dir)
    if name not in classes:
        raise EngineLoadError(f"{model_dir}: pipeline {name} is not served by this adapter "
                              f"(it serves {', '.join(sorted(classes))})")
    torch_type = torch_dtype(dtype, device)
    if wants_dummy(load_format, model_dir):
        components = {**random_components(model_dir, components, dtype=torch_type,
                                          device=device), **components}
    pipe = classes[name].from_pretrained(model_dir, dtype=torch_type, **components)
    pipe.set_progress_bar_config(disable=True)  # progress goes to clients, not stderr
    return pipe.to(device)


def limits(options: Mapping[str, Any], **defaults: Any) -> Limits:
    """The stage's request limits: its options over the adapter's defaults."""
    try:
        return Limits.from_options(options, **defaults)
    except LimitsError as e:
        raise EngineLoadError(str(e)) from e


def generator(seed: int) -> torch.Generator:
    """A CPU generator: the same seed draws the same noise on every device."""
    return torch.Generator(device="cpu").manual_seed(seed)


def prompt_of(inputs: Mapping[str, Any], name: str = "prompt", required: bool = True) -> str:
    value = inputs.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise ValueError(f"'{name}' must be a non-empty string")
    return value


def request_plan(inputs: Mapping[str, Any], params: Mapping[str, Any], lim: Limits, *,
                 no_negative: str | None = None, min_steps: int = 1, batched: bool = True,
                 release_guidance: bool = False) -> dict[str, Any]:
    """The checked fields every diffusion request plan has: prompt, negative_prompt
    (``no_negative`` where the request sends none: None, or "" for a pipeline that takes
    a string), steps, n (``batched`` models only), guidance and seed.
    ``release_guidance``: guidance is None where the request names none, so that the
    release's own guider settings apply. The family adds its own fields (size, images)."""
    plan = {"prompt": prompt_of(inputs),
            "negative_prompt": prompt_of(inputs, "negative_prompt", False) or no_negative,
            "steps": bounded_int(params, "steps", lim.default_steps, min_steps, lim.max_steps)}
    if batched:
        plan["n"] = bounded_int(params, "n", 1, 1, lim.max_n)
    named = params.get("guidance_scale") is not None
    plan["guidance"] = (guidance(params, lim.default_guidance)
                        if named or not release_guidance else None)
    plan["seed"] = seed_of(params)
    return plan


def frames_for(seconds: float, fps: int, temporal: int) -> int:
    """The frame count nearest ``seconds`` at ``fps`` that a video VAE with ``temporal``
    compression can take (temporal * k + 1)."""
    k = max(1, round(seconds * fps / temporal))
    return temporal * k + 1


def video_frames(params: Mapping[str, Any], lim: Limits, temporal: int,
                 suggest: bool = False) -> int:
    """The request's frame count, checked to be temporal * k + 1 (what a video VAE with
    ``temporal`` compression takes); ``suggest``: the message names the nearest one."""
    frames = bounded_int(params, "frames", lim.default_frames, 1, lim.max_frames)
    if (frames - 1) % temporal:
        hint = f" (e.g. {frames_for(frames / lim.fps, lim.fps, temporal)})" if suggest else ""
        raise ValueError(f"'frames' must be {temporal}k+1 for this model{hint}")
    return frames


def open_image(data: Any, what: str = "image") -> Any:
    """Encoded image bytes (PNG, JPEG, WebP, ...) -> an RGB PIL image."""
    from PIL import Image, UnidentifiedImageError

    if not isinstance(data, bytes | bytearray) or not data:
        raise ValueError(f"'{what}' must be an image file")
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as e:
        raise ValueError(f"'{what}' is not an image this server can read ({e})") from None


def edit_image(images: list[Any], edit: bool, editor: str) -> Any:
    """The input image of a model that edits one image at a time (an RGB PIL image), or
    None for a text-to-image model; ValueError when the request and the model disagree.
    ``editor``: the family's editing model, named in the messages."""
    if edit and not images:
        raise ValueError("this is an image-editing model: send the image to edit "
                         "(POST /v1/images/edits)")
    if images and not edit:
        raise ValueError("this is a text-to-image model and takes no input image; "
                         f"edits need an image-editing model (e.g. {editor})")
    if len(images) > 1:
        raise ValueError(f"{editor} edits one image per request")
    return open_image(images[0]) if images else None


def with_image_latents(job: DenoiseJob) -> torch.Tensor:
    """The transformer's input of a packed-latent job: its noise latents, then the input
    images' latents where it edits (their outputs are dropped)."""
    image_latents = job.state["image_latents"]
    if image_latents is None:
        return job.latents
    return torch.cat([job.latents, image_latents], dim=1)


def flow_preview(job: DenoiseJob,
                 pixels_of: Callable[[DenoiseJob, torch.Tensor], torch.Tensor]) -> dict[str, Any]:
    """The flow-matching estimate of the clean latents, x0 = x_t - sigma_t * v, decoded:
    what the image will look like, sharpening as steps go by."""
    sigma = job.scheduler.sigmas[job.step].to(job.latents)
    return {"preview": pixels_of(job, job.latents - sigma * job.last_output)}


def to_uint8(pixels: torch.Tensor) -> torch.Tensor:
    """VAE output in [-1, 1], channels first -> uint8 channels last, on the CPU."""
    pixels = (pixels.float() / 2 + 0.5).clamp(0, 1)
    return (pixels * 255).round().to(torch.uint8).movedim(-3, -1).contiguous().cpu()
