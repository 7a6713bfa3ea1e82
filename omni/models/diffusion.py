"""What the diffusers adapters (qwen_image.py, wan.py) share: loading a pipeline
directory, request limits, seeds, and reference images.

Request limits live in diffusion_limits.py (no torch: the API checks them too).
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from omni.engines.base import EngineLoadError
from omni.models.diffusion_limits import (  # noqa: F401  (the adapters' one import)
    LIMIT_OPTIONS,
    Limits,
    LimitsError,
    bounded_int,
    guidance,
    parse_size,
    seed_of,
)

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


def load_pipeline(model_dir: str, classes: Mapping[str, Any], *, device: str,
                  dtype: str, **components: Any) -> Any:
    """The whole pipeline, every component loaded through its own class from its own
    folder (diffusers' from_pretrained reads model_index.json), on ``device``;
    ``components`` are ones the adapter loaded itself."""
    name = pipeline_class(model_dir)
    if name not in classes:
        raise EngineLoadError(f"{model_dir}: pipeline {name} is not served by this adapter "
                              f"(it serves {', '.join(sorted(classes))})")
    pipe = classes[name].from_pretrained(model_dir, dtype=torch_dtype(dtype, device),
                                         **components)
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


def to_uint8(pixels: torch.Tensor) -> torch.Tensor:
    """VAE output in [-1, 1], channels first -> uint8 channels last, on the CPU."""
    pixels = (pixels.float() / 2 + 0.5).clamp(0, 1)
    return (pixels * 255).round().to(torch.uint8).movedim(-3, -1).contiguous().cpu()
