"""Video input of Qwen2.5-VL and Qwen3-VL: what the release's video processor and processor
do to a video, re-expressed with PyAV and PIL (transformers' video processors of both
families need torchvision, which this server does not install).

- Limits (`VideoRules`): the release's video processor config
  (video_preprocessor_config.json, else preprocessor_config.json, as transformers falls
  back) over the family's class defaults: frames a second, min/max frames, the pixel
  range, patch / merge / temporal patch sizes, mean and std.
- Frames (`sample_indices`): the processors' own ``sample_frames`` rule over the header's
  frame count and rate (``do_sample_frames`` with the config's fps, 2 when it has none:
  Qwen's qwen-vl-utils rate, as the model cards use; Qwen2-VL's processor would otherwise
  keep every frame). Qwen2.5-VL (Qwen2VLVideoProcessor): the count floored to whole
  temporal patches, indices ``arange(0, total, total / n)``; Qwen3-VL: ``int(total / fps
  * rate)`` clamped, indices ``linspace(0, total - 1, n).round()``.
- Size (`frame_size`): Qwen2.5-VL: the per-frame ``smart_resize``; Qwen3-VL: its video
  ``smart_resize`` whose pixel range counts every frame (t * h * w). Frames are resized
  with PIL bicubic as decoded (the processor resizes with torchvision: pixel values differ
  slightly), so memory holds only the sampled, resized frames.
- Patches (`patchify`): rescale, normalise, pad to whole temporal patches with the last
  frame, cut as the processors' ``patchify`` does (merge group by merge group).
- Time: Qwen2.5-VL's rotary time axis steps by ``second_per_grid_ts`` = temporal patch /
  sampled fps (its processor's ``_process_videos``; sampled fps = n / total * fps, as
  ``VideoMetadata.sampled_fps``). Qwen3-VL writes each temporal patch's time into the
  prompt instead: ``<{t:.1f} seconds>`` then <|vision_start|>, the patch's tokens,
  <|vision_end|> (its processor's ``replace_video_token``; t is the mean time of the
  patch's first and last frame, ``_calculate_timestamps``).
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
QWEN_VL_UTILS_FPS = 2.0
# the class defaults of Qwen2VLVideoProcessor (Qwen2.5-VL) and Qwen3VLVideoProcessor
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen2_5_vl": dict(min_pixels=128 * 28 * 28, max_pixels=28 * 28 * 768, patch=14,
                       mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD),
    "qwen3_vl": dict(min_pixels=128 * 32 * 32, max_pixels=32 * 32 * 768, patch=16,
                     mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)),
}


@dataclass(frozen=True)
class VideoRules:
    """How a family's release processor samples, sizes and cuts a video."""

    family: str
    fps: float
    min_frames: int
    max_frames: int
    min_pixels: int
    max_pixels: int
    patch: int
    merge: int
    temporal: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    rescale: float

    @property
    def timestamps(self) -> bool:
        """Qwen3-VL writes frame times into the prompt (Qwen2.5-VL rotates by them)."""
        return self.family == "qwen3_vl"


@dataclass
class Clip:
    """One decoded video: patches (n, dim), grid (1, 3), seconds per temporal patch and
    each temporal patch's time (seconds)."""

    patches: torch.Tensor
    grid: torch.Tensor
    second_per_grid: float
    times: list[float]


def load_rules(path: Path, family: str) -> VideoRules:
    """The release's video processor settings over the family's defaults."""
    config: dict[str, Any] = {}
    for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
        if (path / name).is_file():
            config = json.loads((path / name).read_text())
            break
    base = FAMILY_DEFAULTS[family]
    size = config.get("size") or {}
    return VideoRules(
        family=family, fps=float(config.get("fps") or QWEN_VL_UTILS_FPS),
        min_frames=int(config.get("min_frames", 4)),
        max_frames=int(config.get("max_frames", 768)),
        min_pixels=int(size.get("shortest_edge") or config.get("min_pixels")
                       or base["min_pixels"]),
        max_pixels=int(size.get("longest_edge") or config.get("max_pixels")
                       or base["max_pixels"]),
        patch=int(config.get("patch_size", base["patch"])),
        merge=int(config.get("merge_size", 2)),
        temporal=int(config.get("temporal_patch_size", 2)),
        mean=tuple(config.get("image_mean", base["mean"])),
        std=tuple(config.get("image_std", base["std"])),
        rescale=float(config.get("rescale_factor", 1 / 255)))


def probe(data: bytes) -> tuple[int, float, int, int]:
    """(frames, frames a second, width, height) from a video's headers; ValueError when it
    is not a video. A container that does not count its frames gets duration x rate."""
    import av

    try:
        with av.open(io.BytesIO(data)) as container:
            stream = container.streams.video[0]
            rate = float(stream.average_rate or 0)
            total = int(stream.frames or 0)
            if not total and rate and container.duration:
                total = int(container.duration / av.time_base * rate)
            width, height = stream.codec_context.width, stream.codec_context.height
    except (av.FFmpegError, IndexError) as e:
        raise ValueError(f"not a video this server can read ({e})") from None
    if not rate or total < 1:
        raise ValueError("not a video this server can read (no frame rate or frame count)")
    return total, rate, width, height


def sample_indices(rules: VideoRules, total: int, fps: float) -> list[int]:
    """Indices of the frames the family's processor keeps (its sample_frames rule)."""
    if rules.timestamps:
        n = min(max(int(total / fps * rules.fps), rules.min_frames), rules.max_frames, total)
        if n < rules.temporal:  # its smart_resize refuses fewer than a temporal patch
            raise ValueError(f"the video has {total} frame(s); at least {rules.temporal} "
                             "are needed")
        return np.linspace(0, total - 1, n).round().astype(int).tolist()
    tp = rules.temporal
    most = math.floor(min(rules.max_frames, total) / tp) * tp
    n = math.floor(min(max(total / fps * rules.fps, rules.min_frames), most, total) / tp) * tp
    if n < 1:
        raise ValueError(f"the video has {total} frame(s); at least {tp} are needed")
    return torch.arange(0, total, total / n).int().tolist()


def frame_size(rules: VideoRules, frames: int, width: int, height: int) -> tuple[int, int]:
    """(width, height) of the sampled frames: the family's smart_resize."""
    factor = rules.patch * rules.merge
    if rules.timestamps:
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

        h, w = smart_resize(frames, height, width,
                            temporal_factor=rules.temporal, factor=factor,
                            min_pixels=rules.min_pixels, max_pixels=rules.max_pixels)
    else:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        h, w = smart_resize(height, width, factor=factor, min_pixels=rules.min_pixels,
                            max_pixels=rules.max_pixels)
    return w, h


def token_count(rules: VideoRules, data: bytes) -> int:
    """The tokens a video takes in the prompt (pads only), from its headers."""
    total, fps, width, height = probe(data)
    n = len(sample_indices(rules, total, fps))
    w, h = frame_size(rules, n, width, height)
    return -(-n // rules.temporal) * (h // rules.patch) * (w // rules.patch) // rules.merge**2


def decode(rules: VideoRules, data: bytes) -> Clip:
    """A video's sampled frames, resized, as patches with their grid and times."""
    import av
    from PIL import Image

    total, fps, width, height = probe(data)
    indices = sample_indices(rules, total, fps)
    size = frame_size(rules, len(indices), width, height)
    wanted = set(indices)
    kept: dict[int, np.ndarray] = {}
    try:
        with av.open(io.BytesIO(data)) as container:
            for i, frame in enumerate(container.decode(container.streams.video[0])):
                if i in wanted:
                    image = frame.to_image().convert("RGB").resize(size, Image.BICUBIC)
                    kept[i] = np.asarray(image)  # uint8 until all are in
                if i >= indices[-1]:
                    break
    except (av.FFmpegError, ValueError) as e:
        raise ValueError(f"not a video this server can read ({e})") from None
    if len(kept) < len(wanted):
        raise ValueError(f"the video ended after {len(kept)} of the {len(wanted)} frames "
                         f"its header promises")
    patches, grid = patchify(rules, np.stack([kept[i] for i in indices]))
    sampled_fps = len(indices) / total * fps
    return Clip(patches, grid, rules.temporal / sampled_fps, _times(rules, indices, fps))


def patchify(rules: VideoRules, pixels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """(patches (t * h * w, C * tp * p * p), grid (1, 3)) of (T, H, W, C) uint8 pixels."""
    p, m, tp = rules.patch, rules.merge, rules.temporal
    x = torch.from_numpy(pixels).permute(0, 3, 1, 2).float() * rules.rescale
    x = (x - torch.tensor(rules.mean).view(1, -1, 1, 1)) / torch.tensor(rules.std).view(
        1, -1, 1, 1)
    if pad := -len(x) % tp:
        x = torch.cat((x, x[-1:].expand(pad, -1, -1, -1)))
    c, gt, gh, gw = x.shape[1], len(x) // tp, x.shape[2] // p, x.shape[3] // p
    x = x.view(gt, tp, c, gh // m, m, p, gw // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gt * gh * gw, c * tp * p * p), torch.tensor([[gt, gh, gw]])


def _times(rules: VideoRules, indices: list[int], fps: float) -> list[float]:
    """Each temporal patch's time: the mean of its first and last frame's."""
    tp = rules.temporal
    padded = indices + [indices[-1]] * (-len(indices) % tp)
    return [(padded[i] / fps + padded[i + tp - 1] / fps) / 2
            for i in range(0, len(padded), tp)]


def video_tokens(rules: VideoRules, clip: Clip, video_id: int, frame_start: int,
                 frame_end: int, tokenize: Any) -> list[int]:
    """What one <|video_pad|> of the template becomes: its pads, or for Qwen3-VL per
    temporal patch ``<t seconds>`` <|vision_start|> pads <|vision_end|>."""
    t, h, w = (int(x) for x in clip.grid[0])
    per_patch = h * w // rules.merge**2
    if not rules.timestamps:
        return [video_id] * (t * per_patch)
    out: list[int] = []
    for seconds in clip.times:
        out += tokenize(f"<{seconds:.1f} seconds>")
        out += [frame_start] + [video_id] * per_patch + [frame_end]
    return out
