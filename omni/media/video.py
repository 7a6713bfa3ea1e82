"""MP4 files from generated frames (PyAV: H.264 in MP4, FFmpeg's libx264)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from omni.media.audio import stream_seconds


def encode_mp4(frames: Any, fps: int, crf: int = 18, audio: Any = None,
               audio_rate: int = 24000) -> bytes:
    """uint8 (F, H, W, 3) frames (+ optional float32 audio at audio_rate, as AAC: mono
    (samples,) or (channels, samples) with 1 or 2 channels) -> MP4 bytes (H.264, yuv420p,
    plays in browsers). yuv420p needs even sides: an odd last row/column is dropped."""
    import av

    video = np.asarray(frames, dtype=np.uint8)
    if video.ndim != 4 or video.shape[-1] != 3 or len(video) == 0:
        raise ValueError(f"frames must be (F, H, W, 3) uint8, got {video.shape}")
    samples = None if audio is None else _channels_first(audio)
    height, width = video.shape[1] // 2 * 2, video.shape[2] // 2 * 2
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=int(fps))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": str(crf), "preset": "veryfast"}
        layout = None if samples is None else ("mono", "stereo")[len(samples) - 1]
        sound = None if samples is None else container.add_stream("aac", rate=audio_rate)
        if sound is not None:
            sound.layout = layout  # before the first mux opens the codecs
        for frame in video[:, :height, :width]:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(
                np.ascontiguousarray(frame), format="rgb24")))
        container.mux(stream.encode(None))
        if sound is not None:
            for start in range(0, samples.shape[1], 1024):
                # packed float: channels interleaved in one row
                piece = av.AudioFrame.from_ndarray(
                    np.ascontiguousarray(samples[:, start:start + 1024].T).reshape(1, -1),
                    format="flt", layout=layout)
                piece.sample_rate = audio_rate
                container.mux(sound.encode(piece))
            container.mux(sound.encode(None))
    return out.getvalue()


def _channels_first(audio: Any) -> np.ndarray:
    samples = np.asarray(audio, dtype=np.float32)
    samples = samples.reshape(1, -1) if samples.ndim == 1 else samples
    if samples.ndim != 2 or samples.shape[0] not in (1, 2) or samples.shape[1] == 0:
        raise ValueError(f"audio must be (samples,) or (channels 1|2, samples) float32, "
                         f"got {np.shape(audio)}")
    return samples


def decode_mp4(data: bytes) -> tuple[np.ndarray, float]:
    """MP4 bytes -> (uint8 (F, H, W, 3) frames, fps); for tests and clients' checks."""
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        return np.stack(frames), float(stream.average_rate or 0)


def probe_video(data: bytes) -> tuple[int, int, float]:
    """(width, height, seconds) of a video file from its headers (nothing is decoded but
    what a container needs to report them); ValueError when it is not one."""
    import av

    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.video:
                raise ValueError("the file has no video stream (is it cut short?)")
            stream = container.streams.video[0]
            seconds = stream_seconds(container, stream)
            if seconds <= 0:  # e.g. a still image, which FFmpeg also opens
                raise ValueError("not a video this server can read (it has no duration)")
            return stream.codec_context.width, stream.codec_context.height, seconds
    except av.FFmpegError as e:
        raise ValueError(f"not a video this server can read ({e})") from None
