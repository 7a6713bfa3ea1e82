"""Camera frames as robots send them -> the tensors a policy model reads.

Frames may be HWC or CHW, uint8 or float in [0, 1] (openpi's image_tools convention).
Anything else is refused with a message naming the camera's key: a robot must never get
actions computed from a frame the policy could not read as the robot meant it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

MAX_SIDE = 4096  # pixels: a bigger frame is refused before any resize
FLOAT_SLACK = 1e-3  # float frames a hair outside [0, 1] (rounding) are still frames


def image_uint8(name: str, value: Any) -> torch.Tensor:
    """One camera frame -> uint8 (3, H, W); ValueError naming ``name`` for anything else."""
    if not isinstance(value, np.ndarray):
        raise ValueError(f"camera {name!r} must be an image array (H, W, 3) or (3, H, W), "
                         f"got {type(value).__name__}")
    if value.ndim != 3:
        raise ValueError(f"camera {name!r} must be an image array (H, W, 3) or (3, H, W), "
                         f"got shape {tuple(value.shape)}")
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
        return torch.from_numpy(_float_frame_uint8(name, value))
    raise ValueError(f"camera {name!r} has dtype {value.dtype}; send uint8, or float in "
                     "[0, 1]")


def _float_frame_uint8(name: str, value: np.ndarray) -> np.ndarray:
    """A float frame in [0, 1] -> uint8 (openpi's image_tools.convert_to_uint8). A frame of
    0..255 floats or with NaN is refused: clipping it would hand the policy a white or
    black picture that looks like a frame."""
    frame = value.astype(np.float32)
    if not np.isfinite(frame).all():
        raise ValueError(f"camera {name!r} holds NaN or infinity")
    low, high = float(frame.min()), float(frame.max())
    if low < -FLOAT_SLACK or high > 1 + FLOAT_SLACK:
        raise ValueError(f"camera {name!r} is a float frame with values {low:g}..{high:g}; "
                         "float frames must be in [0, 1] (or send uint8 0..255)")
    return np.ascontiguousarray((np.clip(frame, 0, 1) * 255.0).round().astype(np.uint8))


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
