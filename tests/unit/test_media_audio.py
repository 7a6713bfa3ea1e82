"""The incremental audio encoders (omni/media/audio.py): every format, streamed and whole,
decodes to the input's duration, and closing mid-encode is safe."""

from __future__ import annotations

import io
import threading

import av  # declared (setup.cfg): a broken install fails, not skips
import numpy as np
import pytest

from omni.media.audio import FORMATS, AudioEncoder

RATE = 22_050
TONE = (0.3 * np.sin(2 * np.pi * 440 * np.arange(int(RATE * 2.5)) / RATE)).astype(np.float32)


def _seconds(data: bytes, fmt: str) -> float:
    if fmt == "pcm":
        return len(data) / 2 / 24_000
    frames = list(av.open(io.BytesIO(data)).decode(audio=0))
    return sum(f.samples for f in frames) / frames[0].sample_rate


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("streaming", [False, True])
def test_every_format_round_trips_its_duration(fmt, streaming):
    encoder = AudioEncoder(fmt, RATE, streaming)
    pieces = [encoder.encode(chunk) for chunk in np.array_split(TONE, 4)]
    pieces.append(encoder.finish())
    if streaming and fmt in ("mp3", "wav", "pcm", "flac"):
        assert sum(1 for p in pieces[:-1] if p) >= 3  # bytes leave as chunks arrive
    assert _seconds(b"".join(pieces), fmt) == pytest.approx(2.5, rel=0.05)


def test_close_while_another_thread_encodes_is_safe():
    encoder = AudioEncoder("mp3", RATE, streaming=True)
    long = np.tile(TONE, 8)
    errors = []

    def work():
        try:
            for _ in range(4):
                encoder.encode(long)
        except RuntimeError as e:  # closed under it: a clean error, never a crash
            errors.append(str(e))

    thread = threading.Thread(target=work)
    thread.start()
    encoder.close()
    thread.join(30)
    assert not thread.is_alive()
    assert errors in ([], ["the encoder is closed"])
    with pytest.raises(RuntimeError, match="closed"):
        encoder.encode(TONE)


def test_unknown_format_and_bad_rate():
    with pytest.raises(ValueError, match="unknown audio format"):
        AudioEncoder("ogg", RATE, False)
    with pytest.raises(ValueError, match="sample rate"):
        AudioEncoder("wav", 0, False)
