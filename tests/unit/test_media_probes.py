"""The header probes of omni/media/ against media bombs (omni/fixtures/media_bombs.py):
each is refused by a limit named in its error, before anything decodes it (the process's
peak memory does not move), and honest files of the same kinds still pass."""

from __future__ import annotations

import resource

import numpy as np
import pytest

from omni.fixtures.media_bombs import flac_declaring, png_declaring, truncated_mp4, wav_declaring
from omni.media.audio import AudioEncoder, decode_audio, wav_header, wav_seconds
from omni.media.image import MAX_IMAGE_PIXELS, check_image, encode_image
from omni.media.video import encode_mp4, probe_video

PEAK_SLACK_KB = 200 * 1024  # generous: a decoded bomb would be gigabytes


def _peak_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


@pytest.mark.parametrize("side", [60000, 9000])
def test_a_png_declaring_too_many_pixels_is_refused_by_its_header(side):
    bomb = png_declaring(side, side)
    assert len(bomb) < 200
    before = _peak_kb()
    with pytest.raises(ValueError, match=f"{MAX_IMAGE_PIXELS} pixels"):
        check_image(bomb)
    assert _peak_kb() - before < PEAK_SLACK_KB


def test_honest_images_pass_and_garbage_is_not_an_image():
    assert check_image(encode_image(np.zeros((6, 10, 3), np.uint8))) == (10, 6)
    assert check_image(png_declaring(100, 100)) == (100, 100)  # the header is what counts
    with pytest.raises(ValueError, match="not an image"):
        check_image(b"\x89PNG\r\n\x1a\nnot really")


@pytest.mark.parametrize("bomb", [wav_declaring(2 * 3600), flac_declaring(5 * 3600)],
                         ids=["wav-2h", "flac-5h"])
def test_audio_declaring_hours_is_refused_before_decoding(bomb):
    assert len(bomb) < 64 * 1024
    before = _peak_kb()
    with pytest.raises(ValueError, match=r"declares \d+ s; at most 300 s"):
        decode_audio(bomb, 16000, 300.0)
    assert _peak_kb() - before < PEAK_SLACK_KB


def test_audio_within_the_limit_and_streamed_wavs_decode():
    samples = np.zeros(24000, "<i2").tobytes()
    assert wav_seconds(wav_header(24000, len(samples)) + samples) == pytest.approx(1.0)
    streamed = wav_header(24000, None) + samples  # "unknown length": not a bomb
    assert wav_seconds(streamed) == 0.0
    assert len(decode_audio(streamed, 16000, 300.0)) == 16000
    encoder = AudioEncoder("flac", 24000, streaming=True)  # no sample count at all
    flac = encoder.encode(np.zeros(24000, np.float32)) + encoder.finish()
    assert len(decode_audio(flac, 16000, 300.0)) == pytest.approx(16000, abs=400)


def test_decoding_stops_at_the_limit_whatever_the_header_says():
    # a streamed FLAC declares no length (FFmpeg sizes a WAV by its bytes, so a WAV
    # cannot hide its length); 3 s of it, with a 2 s limit
    encoder = AudioEncoder("flac", 24000, streaming=True)
    audio = encoder.encode(np.zeros(3 * 24000, np.float32)) + encoder.finish()
    with pytest.raises(ValueError, match="longer than 2 s"):
        decode_audio(audio, 16000, 2.0)


def test_a_truncated_mp4_is_not_a_video():
    whole = encode_mp4(np.zeros((8, 32, 32, 3), np.uint8), fps=8)
    assert probe_video(whole) == (32, 32, 1.0)
    with pytest.raises(ValueError, match="no video stream"):
        probe_video(truncated_mp4())
