"""Qwen3-Omni's image and video input: what the release's processors and thinker forward
do, per request, in a form the AR engine's packed steps can use (omni/engines/ar/media.py).

- Images: the release's Qwen2-VL image processor (its PIL form: the default form needs
  torchvision) turns each image into patches and a (t, h, w) grid; the vision tower
  gives one embedding per merged patch (h * w / merge^2 of them, replacing that many
  <|image_pad|> tokens) plus "deepstack" features from some of its layers.
- Videos: PyAV decodes the file and keeps VIDEO_FPS frames a second (`decode_video`);
  `video_patches` cuts them as the Qwen2-VL video processor does (that one needs
  torchvision), at the image processor's pixel budget capped at the video processor's
  default (VIDEO_MAX_PIXELS), resized with PIL as decoded (the video
  processor resizes with torchvision: pixel values differ slightly from it). Each
  temporal patch spans temporal_patch_size / rate seconds; the time axis of the rotary
  positions steps by that x position_id_per_seconds, not always a whole number.
- Rotary positions: the thinker's text model takes (4, batch, tokens) position ids, a
  text row (the cache position) and the three rotary axes, which the model's own
  `get_rope_index` computes for the prompt (as floats); after the prompt every axis is
  the cache position + the returned delta.
- Deepstack: transformers adds feature i to the visual tokens' hidden states right after
  decoder layer i. A pre-hook on layer i+1 (or on the final norm) does the same here, so
  the hidden states transformers records (layer outputs) stay as its own forward has them.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import Any

import torch

IMAGE_PARTS = ("image",)  # {"type": "image", "image": {"data": <image file bytes>}}
VIDEO_PARTS = ("video",)  # {"type": "video", "video": {"data": <video file bytes>}}
# Video sampling, as Qwen's own input helper (qwen-omni-utils) does before the processor:
# 2 frames a second, at least 4 and at most 768 frames, an even count (2 frames per
# temporal patch); each temporal patch then spans temporal_patch_size / fps seconds.
VIDEO_FPS, VIDEO_MIN_FRAMES, VIDEO_MAX_FRAMES = 2.0, 4, 768
# Pixels per video frame at most: the Qwen2-VL video processor's default (28 * 28 * 768);
# the image processor's budget (up to ~12.8 M pixels in a release) would make a long
# video far more tokens than any cache holds.
VIDEO_MAX_PIXELS = 28 * 28 * 768


class TextFirstRope:
    """position_ids of the Qwen3-VL family: the text row, then the rotary axes."""

    axes = 3

    @staticmethod
    def position_ids(text: torch.Tensor, axes: torch.Tensor) -> torch.Tensor:
        return torch.cat((text[None], axes.to(text.device)))[:, None, :]


class Deepstack:
    """Adds per-layer vision features to the visual tokens of a packed forward."""

    def __init__(self, layers: Any, final_norm: Any, count: int) -> None:
        self.pending: tuple[torch.Tensor, list[torch.Tensor]] | None = None
        for i in range(count):  # feature i goes in after layer i: before layer i + 1
            after = layers[i + 1] if i + 1 < len(layers) else final_norm
            after.register_forward_pre_hook(self._hook(i))

    def _hook(self, index: int) -> Any:
        def add(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
            if self.pending is None or not args:
                return None
            mask, features = self.pending
            hidden = args[0].clone()
            rows = mask.to(hidden.device)
            hidden[0, rows] += features[index].to(hidden.device, hidden.dtype)
            return (hidden, *args[1:])
        return add

    @contextlib.contextmanager
    def inject(self, step: tuple[torch.Tensor, list[torch.Tensor]]) -> Iterator[None]:
        self.pending = step
        try:
            yield
        finally:
            self.pending = None


def install_deepstack(thinker: Any) -> Deepstack:
    text_model = getattr(thinker.model, "language_model", thinker.model)
    count = len(thinker.config.vision_config.deepstack_visual_indexes)
    return Deepstack(text_model.layers, text_model.norm, count)


def decode_image(part: dict[str, Any]) -> Any:
    """The PIL image of an API-decoded image part."""
    from PIL import Image, UnidentifiedImageError

    image = part.get("image") or {}
    if not isinstance(image.get("data"), bytes):
        raise ValueError("an image part reached the engine undecoded")
    try:
        with Image.open(io.BytesIO(image["data"])) as im:
            return im.convert("RGB")
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as e:
        raise ValueError(f"not an image this server can read ({e})") from None


def rope_index(thinker: Any, ids: list[int], images: dict[str, Any] | None,
               videos: dict[str, Any] | None, audio_lengths: torch.Tensor | None,
               audio_in_video: bool = False) -> tuple[torch.Tensor, float]:
    """(3, len(ids)) rotary positions of a prompt with images / videos, and the delta
    after it (the model's own get_rope_index)."""
    owner = thinker.model if hasattr(thinker.model, "get_rope_index") else thinker
    ids_t = torch.tensor([ids])
    positions, delta = owner.get_rope_index(
        ids_t, image_grid_thw=images["grid"] if images else None,
        video_grid_thw=videos["grid"] if videos else None,
        attention_mask=torch.ones_like(ids_t), use_audio_in_video=audio_in_video,
        audio_seqlens=audio_lengths,
        second_per_grids=videos["second_per_grid"] if videos else None)
    # float, as the model computes them: a video's time axis steps by seconds per grid x
    # position_id_per_seconds, which need not be whole
    return positions[:, 0].float().cpu(), float(delta.reshape(-1)[0])


def video_audio_tokens(config: Any, merge: int) -> dict[str, int]:
    """The ids and rates that lay out a video heard with its audio track."""
    return {"video": int(config.video_token_id), "audio": int(config.audio_token_id),
            "start": int(config.audio_start_token_id), "end": int(config.audio_end_token_id),
            "per_second": int(config.position_id_per_seconds), "merge": merge}


def interleaved_video(tokens: dict[str, int], videos: dict[str, Any], index: int,
                      audio_count: int) -> list[int]:
    """A video heard with its track, as the release's processor lays it out: between
    <|audio_start|> and <|audio_end|>, each temporal patch's tokens at its start time (in
    positions: seconds x position_id_per_seconds) and the audio tokens (audio token j at
    position j) in that order between them; a patch goes before audio of the same time."""
    t, h, w = (int(x) for x in videos["grid"][index])
    per_patch = (h // tokens["merge"]) * (w // tokens["merge"])
    step = float(videos["second_per_grid"][index]) * tokens["per_second"]
    out, patch, heard = [tokens["start"]], 0, 0
    while patch < t and heard < audio_count:
        if patch * step <= heard:
            out += [tokens["video"]] * per_patch
            patch += 1
        else:
            out.append(tokens["audio"])
            heard += 1
    out += [tokens["video"]] * per_patch * (t - patch) + [tokens["audio"]] * (audio_count - heard)
    return out + [tokens["end"]]


def joint_deepstack(ids: torch.Tensor, image_id: int, video_id: int,
                    images: dict[str, Any] | None,
                    videos: dict[str, Any] | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(visual mask over the prompt, per-layer features of its visual tokens in prompt
    order): image and video tokens interleave as their parts do."""
    is_image, is_video = ids == image_id, ids == video_id
    mask = is_image | is_video
    layers = (images or videos)["deepstack"]
    joint = []
    for i, like in enumerate(layers):
        rows = like.new_zeros(int(mask.sum()), like.shape[-1])
        if images:
            rows[is_image[mask]] = images["deepstack"][i].to(rows.dtype)
        if videos:
            rows[is_video[mask]] = videos["deepstack"][i].to(rows.dtype)
        joint.append(rows)
    return mask.cpu(), joint


def frame_size(processor: Any, width: int, height: int) -> tuple[int, int]:
    """(width, height) a video frame is resized to: sides a multiple of patch x merge,
    within the image processor's pixel range capped at VIDEO_MAX_PIXELS."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    factor = int(processor.patch_size) * int(processor.merge_size)
    h, w = smart_resize(height, width, factor=factor, min_pixels=processor.size.shortest_edge,
                        max_pixels=min(processor.size.longest_edge, VIDEO_MAX_PIXELS))
    return w, h


def decode_video(part: dict[str, Any], processor: Any) -> tuple[list[Any], float]:
    """(sampled RGB frames as PIL images at their patch-grid size, their rate per second)
    of an API-checked video part: VIDEO_FPS frames a second by timestamp (more for clips
    too short to give VIDEO_MIN_FRAMES), at most VIDEO_MAX_FRAMES, an even count. Frames
    between the samples are dropped and samples are resized as they are decoded, so
    memory holds only small samples."""
    import av
    from PIL import Image

    from omni.media.video import stream_seconds

    video = part.get("video") or {}
    if not isinstance(video.get("data"), bytes):
        raise ValueError("a video part reached the engine undecoded")
    frames: list[Any] = []
    try:
        with av.open(io.BytesIO(video["data"])) as container:
            stream = container.streams.video[0]
            seconds = stream_seconds(container, stream)
            rate = max(VIDEO_FPS, VIDEO_MIN_FRAMES / seconds) if seconds > 0 else VIDEO_FPS
            for frame in container.decode(stream):
                if frame.time is not None and frame.time + 1e-6 >= len(frames) / rate:
                    image = frame.to_image().convert("RGB")
                    size = frame_size(processor, *image.size)
                    frames.append(image.resize(size, Image.BICUBIC))
                    if len(frames) == VIDEO_MAX_FRAMES:
                        break
    except (av.FFmpegError, IndexError, ValueError) as e:
        raise ValueError(f"not a video this server can read ({e})") from None
    if len(frames) < 2:
        raise ValueError(f"the video gave {len(frames)} frame(s) at {rate:g} per second; "
                         "at least 2 are needed")
    return frames[:len(frames) // 2 * 2], rate


def video_patches(processor: Any, frames: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(patches (grid_t * grid_h * grid_w, C * tp * p * p), grid (1, 3)) of one video's
    frames, in the layout of the Qwen2-VL processors (their video form needs torchvision):
    each frame resized to `frame_size` (a no-op for decode_video's frames), rescaled,
    normalised, and every temporal_patch_size frames cut into patches, ordered merge
    group by merge group. A single image repeated temporal_patch_size times gives exactly
    the image processor's patches (tested)."""
    import numpy as np
    from PIL import Image

    p, m, tp = int(processor.patch_size), int(processor.merge_size), int(
        processor.temporal_patch_size)
    w, h = frame_size(processor, *frames[0].size)
    pixels = np.stack([np.asarray(f.resize((w, h), Image.BICUBIC), dtype=np.float32)
                       for f in frames])  # (T, h, w, C)
    x = torch.from_numpy(pixels).permute(0, 3, 1, 2) * float(processor.rescale_factor)
    mean = torch.tensor(processor.image_mean).view(1, -1, 1, 1)
    x = (x - mean) / torch.tensor(processor.image_std).view(1, -1, 1, 1)
    if pad := -len(x) % tp:
        x = torch.cat((x, x[-1:].expand(pad, -1, -1, -1)))
    gt, gh, gw, c = len(x) // tp, h // p, w // p, x.shape[1]
    x = x.view(gt, tp, c, gh // m, m, p, gw // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gt * gh * gw, c * tp * p * p), torch.tensor([[gt, gh, gw]])
