"""Video input of Qwen2.5-Omni's thinker: what ``Qwen2_5OmniProcessor`` does to a video,
on the machinery of Qwen2.5-VL's (omni/models/qwen_vl_video.py: PyAV + PIL, since
transformers' video processors need torchvision).

- Frames: the release's video processor is a Qwen2VLVideoProcessor (read from
  video_preprocessor_config.json, else preprocessor_config.json), so its own
  ``sample_frames`` rule at its fps (2 when the config has none: Qwen's qwen-omni-utils
  rate, and the fps the Omni processor assumes), min/max frames, patch sizes, mean, std.
- Size: the Omni processor passes its own ``videos_kwargs`` size (128*28*28 to
  768*28*28 pixels a frame) to the video processor, over the config's (whose min/max
  pixels are the image processor's): so those, not the config's.
- Time: the Omni processor's ``video_second_per_grid`` is temporal_patch_size / fps (the
  fps it was called with), not the sampled rate Qwen2.5-VL's uses; the thinker's rotary
  time axis steps by that x ``position_id_per_seconds`` (get_rope_index, .long()).
- With its audio track (``use_audio_in_video``): <|VIDEO|> becomes <|audio_bos|>, then
  per ``seconds_per_chunk`` chunk the video tokens whose time falls in it and the audio
  tokens (token j at time j / position_id_per_seconds) of it, then <|audio_eos|>
  (``replace_video_with_audio_token`` / ``get_chunked_index``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from omni.models.qwen_vl_video import Clip, VideoRules, load_rules
from omni.models.qwen_vl_video import decode as decode_sampled

# Qwen2_5OmniProcessor.videos_kwargs["size"]
OMNI_VIDEO_MIN_PIXELS, OMNI_VIDEO_MAX_PIXELS = 128 * 28 * 28, 768 * 28 * 28


def omni_video_rules(path: Path) -> VideoRules:
    """How the release's processor samples, sizes and cuts a video."""
    return dataclasses.replace(load_rules(path, "qwen2_5_vl"),
                               min_pixels=OMNI_VIDEO_MIN_PIXELS,
                               max_pixels=OMNI_VIDEO_MAX_PIXELS)


def decode_video(rules: VideoRules, data: bytes) -> Clip:
    """A video's sampled frames as patches, with the Omni processor's seconds per grid."""
    clip = decode_sampled(rules, data)
    return dataclasses.replace(clip, second_per_grid=rules.temporal / rules.fps)


def chunks(times: np.ndarray, per_chunk: int) -> list[tuple[int, int]]:
    """(start, end) of the runs of `times` (non-decreasing) in each per_chunk window: the
    processor's get_chunked_index (the first window is always there, maybe empty)."""
    out, start, window = [], 0, 1
    for i, t in enumerate(times):
        if t >= window * per_chunk:
            out.append((start, i))
            start, window = i, window + 1
    return out + [(start, len(times))]


def video_with_audio(clip: Clip, merge: int, audio_count: int, ids: dict[str, int],
                     per_second: float, seconds_per_chunk: float) -> list[int]:
    """What <|VIDEO|> becomes for a video heard with its track (audio_count tokens)."""
    t, h, w = (int(x) for x in clip.grid[0])
    per_patch = (h // merge) * (w // merge)
    video_times = np.repeat(np.arange(t), per_patch) * clip.second_per_grid * per_second
    per_chunk = int(per_second * seconds_per_chunk)
    video, audio = chunks(video_times, per_chunk), chunks(np.arange(audio_count), per_chunk)
    out = [ids["audio_start"]]
    for j in range(max(len(video), len(audio))):
        if j < len(video):
            out += [ids["video"]] * (video[j][1] - video[j][0])
        if j < len(audio):
            out += [ids["audio"]] * (audio[j][1] - audio[j][0])
    return out + [ids["audio_end"]]
