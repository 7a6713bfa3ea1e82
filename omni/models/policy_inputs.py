"""Robot observations as OpenPI clients send them -> what a policy model reads.

An observation is a (nested) dict whose keys are the robot's own (LIBERO:
``observation/image``, ``observation/wrist_image``, ``observation/state``, ``prompt``;
ALOHA: ``images: {cam_high, ...}``, ``state``; DROID splits the state in two). Cameras and
state are found by the stage options ``cameras`` / ``state_keys`` (key paths; a nested
key as ``images.cam_high``), else by shape: every image-shaped array in the order the
client's dict has them, and the first of the usual state keys. Images may be HWC or CHW,
uint8 or float in [0, 1] (as openpi's input transforms accept them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

STATE_KEYS = ("observation/state", "state", "observation.state")
MAX_CAMERAS = 8
MAX_SIDE = 4096  # pixels: a bigger frame is refused before any resize


def lookup(obs: Mapping[str, Any], path: str) -> Any:
    """``path`` as a flat key, else walked through nested dicts on '.'; KeyError."""
    if path in obs:
        return obs[path]
    node: Any = obs
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(path)
        node = node[part]
    return node


def _looks_like_image(value: Any) -> bool:
    return (isinstance(value, np.ndarray) and value.ndim == 3
            and 3 in (value.shape[0], value.shape[-1]) and value.dtype.kind in "uf")


def _walk_images(obs: Mapping[str, Any], prefix: str = "") -> list[tuple[str, np.ndarray]]:
    found = []
    for key, value in obs.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            found += _walk_images(value, f"{name}.")
        elif _looks_like_image(value):
            found.append((name, value))
    return found


def cameras(obs: Mapping[str, Any], keys: Sequence[str] | None) -> list[tuple[str, np.ndarray]]:
    """(name, array) of each camera, in order; ValueError names what is missing."""
    if keys:
        out = []
        for key in keys:
            try:
                out.append((key, lookup(obs, key)))
            except KeyError:
                raise ValueError(f"observation has no camera {key!r} (this policy reads "
                                 f"{', '.join(keys)})") from None
    else:
        out = _walk_images(obs)
        if not out:
            raise ValueError("observation holds no image (an array of shape (H, W, 3) or "
                             "(3, H, W), uint8 or float in [0, 1])")
    if len(out) > MAX_CAMERAS:
        raise ValueError(f"observation has {len(out)} cameras; at most {MAX_CAMERAS}")
    return out


def image_uint8(name: str, value: Any) -> torch.Tensor:
    """One camera frame -> uint8 (3, H, W); ValueError for anything else."""
    if not isinstance(value, np.ndarray) or value.ndim != 3:
        raise ValueError(f"camera {name!r} must be an array (H, W, 3) or (3, H, W)")
    if value.shape[-1] == 3:
        value = value.transpose(2, 0, 1)
    elif value.shape[0] != 3:
        raise ValueError(f"camera {name!r} has shape {tuple(value.shape)}: no axis of 3 "
                         "colour channels")
    _, h, w = value.shape
    if not (1 <= h <= MAX_SIDE and 1 <= w <= MAX_SIDE):
        raise ValueError(f"camera {name!r} is {w}x{h}; each side must be 1..{MAX_SIDE}")
    if value.dtype == np.uint8:
        return torch.from_numpy(np.ascontiguousarray(value))
    if value.dtype.kind == "f":
        # openpi's convention: float frames are in [0, 1] (image_tools.convert_to_uint8)
        scaled = np.clip(np.nan_to_num(value.astype(np.float32)) * 255.0, 0, 255)
        return torch.from_numpy(np.ascontiguousarray(scaled.round().astype(np.uint8)))
    raise ValueError(f"camera {name!r} has dtype {value.dtype}; uint8 or float in [0, 1]")


def resize_pad(image: torch.Tensor, side: int, mean: float = 0.5, std: float = 0.5,
               device: torch.device | str | None = None) -> torch.Tensor:
    """uint8 (3, H, W) -> float (3, side, side) as transformers' PI0ImageProcessor makes
    it: fit inside side x side keeping the aspect ratio (bicubic, antialiased, on the
    uint8 pixels: torch's native uint8 kernel, which torchvision uses for uint8 on the CPU
    and which rounds differently from resizing floats), rescale to [0, 1], normalise, pad
    the bottom and right with zeros (after normalising). Written here because that
    processor needs torchvision, which cannot be installed beside the CPU torch.

    ``device``: where the float work runs. The uint8 frame goes there after the resize
    (which stays on the CPU: the uint8 kernel is CPU-only); on an H200's host, normalising
    two 224x224 cameras on one CPU core and copying the floats up took 0.7 ms of a 1.4 ms
    prepare (bench/probes/pi0_prepare.py), a quarter of the bytes and a few kernels on
    the GPU."""
    _, h, w = image.shape
    scale = min(side / h, side / w)
    new_h, new_w = int(h * scale), int(w * scale)
    if (new_h, new_w) != (h, w):
        image = F.interpolate(image[None].cpu(), size=(new_h, new_w), mode="bicubic",
                              align_corners=False, antialias=True)[0]
    if device is not None:
        image = image.to(device)
    pixels = (image.float() / 255.0 - mean) / std
    return F.pad(pixels, (0, side - new_w, 0, side - new_h))


def state_vector(obs: Mapping[str, Any], keys: Sequence[str] | None) -> np.ndarray:
    """The robot state as float32 (n,): the named keys concatenated, else the first of
    STATE_KEYS present."""
    if keys:
        parts = []
        for key in keys:
            try:
                parts.append(lookup(obs, key))
            except KeyError:
                raise ValueError(f"observation has no {key!r} (the state is read from "
                                 f"{', '.join(keys)})") from None
    else:
        present = [k for k in STATE_KEYS if k in obs]
        if not present:
            raise ValueError(f"observation has no state (one of {', '.join(STATE_KEYS)}, "
                             "or set the stage option 'state_keys')")
        parts = [obs[present[0]]]
    vectors = []
    for part in parts:
        arr = np.asarray(part) if isinstance(part, list | tuple | int | float) else part
        if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "uifb" or arr.ndim > 1:
            raise ValueError("the state must be a 1-D numeric array")
        vectors.append(arr.astype(np.float32).reshape(-1))
    state = np.concatenate(vectors)
    if not np.isfinite(state).all():
        raise ValueError("the state holds NaN or infinity")
    return state


def prompt_text(obs: Mapping[str, Any], default: str | None, max_chars: int = 2000) -> str:
    prompt = obs.get("prompt", default)
    if prompt is None:
        raise ValueError("observation has no 'prompt' and this policy has no default prompt")
    if isinstance(prompt, bytes):
        prompt = prompt.decode("utf-8", "replace")
    if not isinstance(prompt, str):
        raise ValueError("'prompt' must be a string")
    if len(prompt) > max_chars:
        raise ValueError(f"'prompt' is {len(prompt)} characters; at most {max_chars}")
    return prompt
