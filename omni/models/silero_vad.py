"""Silero VAD: streaming voice-activity detection for server-side turn detection.

The OpenAI realtime API's ``turn_detection: {type: "server_vad", threshold,
prefix_padding_ms, silence_duration_ms}`` needs, per session, to hear where the user starts
and stops speaking while the audio arrives. This adapter holds the model quirks: the
weights, the window and context sizes, the recurrent state, the hysteresis of Silero's own
``get_speech_timestamps``. The orchestrator never touches audio, so this runs inside an
engine stage; a ``VadStream`` is one session's state and a ``SileroVad`` the loaded model
that many streams share.

Weights: the ``silero-vad`` wheel (MIT) ships the model as ``silero_vad/data/silero_vad.onnx``
(v5/v6, ~2 MB). The package is never imported (its ``__init__`` imports torch, and its
helpers torchaudio): the file is found through its import spec and run with onnxruntime on
the CPU, one thread, ~0.2 ms per 32 ms window. The model is a stateless function of
(576 samples = 64 of context + a 512-sample window, state [2, 1, 128], sr) ->
(speech probability [1, 1], next state); each stream carries the context and the state.

The stream's rate is 16 kHz mono; resampling (from the realtime API's 24 kHz pcm16, say) is
the caller's business.

``SileroVadRunner`` serves it as a stage (model ``silero_vad``, engine ``generation``): a
streaming runner (omni/engines/generation/streams.py), one VadStream per request, fed the
client's pcm16 as it arrives (``AsyncOmni.generate(..., stream_input=True)`` + ``feed``).
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from omni.engines.base import EngineLoadError

PACKAGE = "silero_vad"
ONNX_FILE = "data/silero_vad.onnx"
INSTALL_COMMAND = "pip install silero-vad==6.2.3"
SAMPLE_RATE = 16000
WINDOW = 512  # samples the model judges per call at 16 kHz (32 ms)
CONTEXT = 64  # samples of the previous window prepended to each call
STATE_SHAPE = (2, 1, 128)
HYSTERESIS = 0.15  # speech turns off below threshold - 0.15, as in get_speech_timestamps
_MS = SAMPLE_RATE // 1000  # samples per millisecond


def weights_path() -> Path:
    """The ONNX file inside the installed wheel, without importing its package."""
    spec = importlib.util.find_spec(PACKAGE)
    roots = list(spec.submodule_search_locations or []) if spec else []
    path = Path(roots[0]) / ONNX_FILE if roots else None
    if path is None or not path.is_file():
        raise EngineLoadError(
            f"Silero VAD's weights are not installed (the silero-vad wheel holds them). "
            f"Install them with `{INSTALL_COMMAND}` (or `bash scripts/install.sh`).")
    return path


class SileroVad:
    """The loaded model: one onnxruntime session, shared by every `VadStream` (its ``run``
    is thread-safe and keeps no state between calls)."""

    def __init__(self, path: str | os.PathLike[str] | None = None,
                 intra_op_threads: int = 1) -> None:
        try:
            import onnxruntime
        except ImportError as e:
            raise EngineLoadError("silero_vad: onnxruntime is not installed") from e
        self.path = Path(path) if path else weights_path()
        so = onnxruntime.SessionOptions()
        so.intra_op_num_threads = intra_op_threads
        so.inter_op_num_threads = 1
        try:
            self.session = onnxruntime.InferenceSession(
                str(self.path), sess_options=so, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own untyped errors
            raise EngineLoadError(f"silero_vad: cannot load {self.path}: {e}") from e
        names = {i.name for i in self.session.get_inputs()}
        if names != {"input", "state", "sr"}:
            raise EngineLoadError(f"silero_vad: {self.path} has inputs {sorted(names)}, "
                                  "expected input, state, sr (Silero VAD v5 or later)")
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)

    def probability(self, window: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        """One call: ``window`` float32 [1, CONTEXT + WINDOW], ``state`` float32
        STATE_SHAPE -> (speech probability of the last WINDOW samples, next state)."""
        out, state = self.session.run(None, {"input": window, "state": state, "sr": self._sr})
        return float(out[0, 0]), state

    def stream(self, **params: Any) -> VadStream:
        return VadStream(self, **params)


def load_silero_vad(path: str | os.PathLike[str] | None = None,
                    intra_op_threads: int = 1) -> SileroVad:
    return SileroVad(path, intra_op_threads)


@dataclass(frozen=True)
class VadEvent:
    kind: Literal["speech_started", "speech_paused", "speech_resumed", "speech_stopped"]
    audio_ms: int  # from the stream's first sample (or its last reset)


class VadStream:
    """One audio stream's voice activity: feed 16 kHz mono audio in pieces of any size,
    get the turn events it completes.

    ``speech_started``: once speech has lasted ``min_speech_ms`` (a one-window blip is no
    turn); audio_ms = where it began minus ``prefix_padding_ms``, never before 0 nor before
    the previous turn's end. ``speech_stopped``: once ``silence_duration_ms`` of non-speech
    has followed it; audio_ms = where the silence began. Speech is on at p >= threshold,
    off at p < threshold - 0.15, unchanged in between.

    With ``pauses``, also ``speech_paused`` when that silence begins (audio_ms: where) and
    ``speech_resumed`` when speech comes back before it has lasted silence_duration_ms: a
    listener may start work on the turn during the silence window (a recognizer's
    transcript of it) and drop it if the speaker goes on.
    """

    def __init__(self, model: SileroVad, threshold: float = 0.5, prefix_padding_ms: int = 300,
                 silence_duration_ms: int = 500, min_speech_ms: int = 64,
                 pauses: bool = False) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold}")
        for name, v in (("prefix_padding_ms", prefix_padding_ms),
                        ("silence_duration_ms", silence_duration_ms),
                        ("min_speech_ms", min_speech_ms)):
            if v < 0:
                raise ValueError(f"{name} must be >= 0, got {v}")
        self.model = model
        self.threshold = float(threshold)
        self.prefix_padding_ms = int(prefix_padding_ms)
        self.silence_duration_ms = int(silence_duration_ms)
        self.min_speech_ms = int(min_speech_ms)
        self.pauses = bool(pauses)
        self.reset()

    def reset(self) -> None:
        """Forget everything: model state, buffered audio, timing (audio_ms restarts at 0)."""
        self._state = np.zeros(STATE_SHAPE, dtype=np.float32)
        self._window = np.zeros((1, CONTEXT + WINDOW), dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)
        self._done = 0  # samples judged so far
        self._start: int | None = None  # where the (candidate or current) speech began
        self._silence: int | None = None  # where the silence after speech began
        self._floor = 0  # the previous turn's end: no padding reaches before it
        self.speaking = False
        self.last_probability = 0.0  # the model's speech probability for the last window

    @property
    def bytes(self) -> int:
        return self._state.nbytes + self._window.nbytes + self._pending.nbytes + 200

    def flush(self) -> list[VadEvent]:
        """The end of the audio: a turn still open stops where its silence began, else at
        the last sample fed (a candidate shorter than min_speech_ms is no turn)."""
        if not self.speaking:
            return []
        end = self._done + len(self._pending) if self._silence is None else self._silence
        self.speaking, self._start, self._silence, self._floor = False, None, None, end
        return [VadEvent("speech_stopped", end // _MS)]

    def feed(self, samples: np.ndarray) -> list[VadEvent]:
        """Append mono 16 kHz audio (int16, or float in [-1, 1]); the events it completes,
        in order. A partial window waits for the next call."""
        x = _as_float32(samples)
        buf = np.concatenate([self._pending, x]) if self._pending.size else x
        whole = len(buf) - len(buf) % WINDOW
        events: list[VadEvent] = []
        for i in range(0, whole, WINDOW):
            event = self._judge(buf[i:i + WINDOW])
            if event is not None:
                events.append(event)
        self._pending = buf[whole:].copy()
        return events

    def _judge(self, chunk: np.ndarray) -> VadEvent | None:
        self._window[0, :CONTEXT] = self._window[0, -CONTEXT:]
        self._window[0, CONTEXT:] = chunk
        p, self._state = self.model.probability(self._window, self._state)
        self.last_probability = p
        begin, self._done = self._done, self._done + WINDOW
        if self.speaking:
            return self._while_speaking(p, begin)
        if p >= self.threshold and self._start is None:
            self._start = begin
        elif p < self.threshold - HYSTERESIS:
            self._start = None  # a blip shorter than min_speech_ms
        if self._start is None or self._done - self._start < self.min_speech_ms * _MS:
            return None
        self.speaking, self._silence = True, None
        start = max(self._floor, self._start - self.prefix_padding_ms * _MS)
        return VadEvent("speech_started", start // _MS)

    def _while_speaking(self, p: float, begin: int) -> VadEvent | None:
        change = None
        if p >= self.threshold:
            if self._silence is not None:
                change = VadEvent("speech_resumed", begin // _MS)
            self._silence = None
        elif p < self.threshold - HYSTERESIS and self._silence is None:
            self._silence = begin
            change = VadEvent("speech_paused", begin // _MS)
        if self._silence is None or self._done - self._silence < self.silence_duration_ms * _MS:
            return change if self.pauses else None
        end, self._floor = self._silence, self._silence
        self.speaking, self._start, self._silence = False, None, None
        return VadEvent("speech_stopped", end // _MS)


def _as_float32(samples: np.ndarray) -> np.ndarray:
    a = np.asarray(samples)
    if a.ndim != 1:
        raise ValueError(f"expected mono samples (1-D), got shape {a.shape}")
    if a.dtype == np.int16:
        return a.astype(np.float32) / 32768.0
    if a.dtype.kind != "f":
        raise TypeError(f"expected int16 or float samples, got {a.dtype}")
    return a.astype(np.float32, copy=False)


# -- the stage: a streaming runner (omni/engines/generation/streams.py) -------------------

STREAM_PARAMS = ("threshold", "prefix_padding_ms", "silence_duration_ms", "min_speech_ms")


@dataclass(eq=False)
class VadRequest:
    """One request's stream and how much audio it has been fed."""

    stream: VadStream
    samples: int = 0


class SileroVadRunner:
    """Streaming runner: per request a VadStream over one shared model. Params (per request,
    the realtime API's server_vad ones): threshold (0..1), prefix_padding_ms,
    silence_duration_ms, min_speech_ms; pauses (true: also speech_paused / speech_resumed,
    VadStream's doc). Input pieces: {"audio": pcm16 little-endian mono bytes,
    "sample_rate": 16000}. Events: {"type": "speech_started" | "speech_stopped" | ...,
    "audio_ms": int}, audio_ms counted from the request's first sample."""

    streams = True
    input_key = "audio"
    OPTIONS = frozenset({"intra_op_threads"})

    def __init__(self, model_dir: str | None, options: Mapping[str, Any] | None = None) -> None:
        path = None
        if model_dir:  # a directory holding silero_vad.onnx, or the file itself
            path = Path(model_dir)
            path = path / "silero_vad.onnx" if path.is_dir() else path
        threads = int((options or {}).get("intra_op_threads", 1))
        self.vad = load_silero_vad(path, threads)

    def open_stream(self, params: Mapping[str, Any]) -> VadRequest:
        kwargs: dict[str, Any] = {"pauses": params.get("pauses") is True}
        for name in STREAM_PARAMS:
            value = params.get(name)
            if value is None:
                continue  # the default
            if (isinstance(value, bool) or not isinstance(value, int | float)
                    or not math.isfinite(value)):
                raise ValueError(f"{name} must be a number, got {value!r}")
            kwargs[name] = value
        return VadRequest(self.vad.stream(**kwargs))

    def feed(self, request: VadRequest, data: Mapping[str, Any]) -> list[dict[str, Any]]:
        if not isinstance(data, Mapping):
            raise ValueError(f"stream input must be a mapping, got {type(data).__name__}")
        rate, audio = data.get("sample_rate"), data.get("audio")
        if rate != SAMPLE_RATE:
            raise ValueError(f"audio must be sampled at {SAMPLE_RATE} Hz (resample it first), "
                             f"got sample_rate {rate!r}")
        if not isinstance(audio, bytes | bytearray | memoryview) or len(audio) % 2:
            raise ValueError("'audio' must be bytes of whole 16-bit little-endian samples")
        samples = np.frombuffer(audio, dtype="<i2").astype(np.float32) / 32768.0
        request.samples += len(samples)
        return [_event(e) for e in request.stream.feed(samples)]

    def close_stream(self, request: VadRequest) -> list[dict[str, Any]]:
        return [_event(e) for e in request.stream.flush()]

    def progress(self, request: VadRequest) -> dict[str, Any]:
        return {"audio_ms": request.samples // _MS}

    def info(self) -> dict[str, Any]:
        return {"sample_rate": SAMPLE_RATE, "model": "silero_vad"}


def _event(event: VadEvent) -> dict[str, Any]:
    return {"type": event.kind, "audio_ms": event.audio_ms}


def build_silero_vad_runner(*, model_dir: str | None, device: str, dtype: str,
                            options: Mapping[str, Any]) -> SileroVadRunner:
    # the CPU whatever the device: a 32 ms window takes ~0.2 ms on one thread
    return SileroVadRunner(model_dir, options)
