"""Whisper in the Hugging Face layout (transformers' WhisperForConditionalGeneration, any
size, CPU or CUDA), as a generation-engine runner beside faster-whisper (whisper.py).

Picked for a directory that holds a transformers Whisper ``config.json`` (model_type
whisper: the openai/whisper-* releases and their fine-tunes): the ``whisper_hf`` model
name, or ``whisper`` pointed at such a directory, or ``--model DIR`` (the
``whisper_hf.yaml`` preset). The front end sends 16 kHz pcm_s16le as for faster-whisper.

Batched across requests: the engine hands every ready clip of one group (same language,
prompt and temperature: what ``generate`` takes once per call) to one ``run_items``
call; their log-mel features go through one ``generate`` call. A clip of at most 30 s is
padded to Whisper's 30 s window as its feature extractor does, so a clip's transcript is
the same alone or in a batch; a longer clip goes through transformers' own long-form
algorithm (sequential 30 s windows, each starting at the last segment's timestamp), in a
batch of its own group. Decoding is greedy at temperature 0 (sampling above), without
timestamps for short clips: one segment spans the clip. A ``prompt`` counts with its last
max_target_positions // 2 - 1 tokens only, as OpenAI's Whisper keeps it (a longer one
would not fit the decoder: generate() raised, a 500).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from omni.engines.base import EngineLoadError
from omni.models.causal_lm import _resolve_dtype
from omni.models.whisper import SAMPLE_RATE, _language_name, _pcm

WINDOW_SECONDS = 30.0  # Whisper's input window
START_TOKENS = 4  # <|startoftranscript|>, language, task, <|notimestamps|>: before the text


def is_hf_whisper(model_dir: str | None) -> bool:
    """A transformers Whisper directory (a CTranslate2 one has no model_type)."""
    if not model_dir:
        return False
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("model_type") == "whisper"


class WhisperHFRunner:
    """Generation-engine runner (items mode): ``audio`` in, one transcription out, clips
    of several requests batched into one ``generate`` call."""

    items = True
    input_key = "audio"
    batches_units = True
    OPTIONS = frozenset({"max_new_tokens"})

    def __init__(self, model_dir: str, device: str, dtype: str,
                 options: Mapping[str, Any] | None = None) -> None:
        import torch
        from transformers import (
            AutoTokenizer,
            WhisperFeatureExtractor,
            WhisperForConditionalGeneration,
        )

        opts = dict(options or {})
        self.max_new_tokens = opts.get("max_new_tokens")
        if self.max_new_tokens is not None and (
                isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int)
                or self.max_new_tokens < 1):
            raise EngineLoadError(f"option max_new_tokens must be a positive integer, got "
                                  f"{self.max_new_tokens!r}")
        self.device = torch.device(device)
        try:
            config = json.loads((Path(model_dir) / "config.json").read_text())
            self.dtype = _resolve_dtype(dtype, self.device, SimpleNamespace(
                dtype=config.get("dtype") or config.get("torch_dtype")))
            self.model = WhisperForConditionalGeneration.from_pretrained(
                model_dir, dtype=self.dtype, local_files_only=True).to(self.device).eval()
            self.features = WhisperFeatureExtractor.from_pretrained(model_dir,
                                                                    local_files_only=True)
            self.tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        except Exception as exc:
            raise EngineLoadError(f"cannot load Whisper from {model_dir}: {exc}") from exc
        gen = self.model.generation_config
        self.lang_ids = {int(i): token.strip("<|>") for token, i in
                         (getattr(gen, "lang_to_id", None) or {}).items()}
        self.multilingual = bool(getattr(gen, "is_multilingual", False))
        self.languages = sorted(self.lang_ids.values()) if self.multilingual else ["en"]

    # -- items-mode contract ------------------------------------------------------------
    def split(self, value: Any, params: Mapping[str, Any]) -> list[np.ndarray]:
        self._check(params)
        clips = value if isinstance(value, list) else [value]
        if not clips:
            raise ValueError("no audio to transcribe")
        return [_pcm(clip) for clip in clips]

    def group_key(self, params: Mapping[str, Any]) -> Any:
        return (params.get("language") or None, params.get("prompt") or None,
                float(params.get("temperature") or 0.0))

    def run_items(self, units: list[np.ndarray],
                  params: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
        long = [len(u) > WINDOW_SECONDS * SAMPLE_RATE for u in units]
        out: list[dict[str, Any] | None] = [None] * len(units)
        for want_long in (False, True):  # short clips batch as 30 s windows, long ones apart
            index = [i for i, is_long in enumerate(long) if is_long == want_long]
            if index:
                texts = self.transcribe([units[i] for i in index], params[index[0]], want_long)
                for i, result in zip(index, texts, strict=True):
                    out[i] = result
        return out  # type: ignore[return-value]

    def pack(self, result: dict[str, Any]) -> dict[str, Any]:
        return result

    def info(self) -> dict[str, Any]:
        return {"model": "whisper_hf", "task": "transcription",
                "input_audio_rate": SAMPLE_RATE, "languages": self.languages,
                "device": str(self.device)}

    # -- work -----------------------------------------------------------------------------
    def transcribe(self, clips: list[np.ndarray], params: Mapping[str, Any],
                   long: bool) -> list[dict[str, Any]]:
        """One generate call over `clips` (all short, or all long)."""
        import torch

        feats = self.features(clips, sampling_rate=SAMPLE_RATE, return_tensors="pt",
                              return_attention_mask=True,
                              **({"truncation": False, "padding": "longest"} if long else {}))
        inputs = feats["input_features"].to(self.device, self.dtype)
        with torch.inference_mode():
            languages = [params["language"]] * len(clips) if params.get("language") \
                else self._detect(inputs)
            sequences = self.model.generate(
                inputs, attention_mask=feats["attention_mask"].to(self.device),
                **self.generate_kwargs({**params, "language": languages}, long))
        if not isinstance(sequences, torch.Tensor):
            sequences = sequences["sequences"]
        return [self._result(row.tolist(), len(clip) / SAMPLE_RATE, language, params)
                for row, clip, language in zip(sequences, clips, languages, strict=True)]

    def _detect(self, inputs: Any) -> list[str]:
        """Each clip's language: Whisper's own detection (its first 30 s) on a
        multilingual model, as generate() does when given none; English otherwise."""
        if not self.multilingual:
            return ["en"] * len(inputs)
        ids = self.model.detect_language(inputs[..., :self.features.nb_max_frames])
        return [self.lang_ids[int(i)] for i in ids.reshape(-1)]

    def generate_kwargs(self, params: Mapping[str, Any], long: bool) -> dict[str, Any]:
        """generate()'s arguments for a group's params (also what a test hands it)."""
        temperature = float(params.get("temperature") or 0.0)
        kwargs: dict[str, Any] = {"task": "transcribe", "return_timestamps": long,
                                  "do_sample": temperature > 0}
        if temperature > 0:
            kwargs["temperature"] = temperature
        if params.get("language"):  # one code, or one per clip
            kwargs["language"] = params["language"]
        prompt = self._prompt_ids(params["prompt"]) if params.get("prompt") else None
        if prompt is not None:
            kwargs["prompt_ids"] = prompt
        if self.max_new_tokens is not None:  # what the decoder has room for beside the prompt
            room = self.model.config.max_target_positions - START_TOKENS - (
                0 if prompt is None else len(prompt))
            kwargs["max_new_tokens"] = min(self.max_new_tokens, room)
        return kwargs

    def _prompt_ids(self, prompt: str) -> Any:
        """<|startofprev|> and the prompt's last max_target_positions // 2 - 1 tokens."""
        import torch

        keep = self.model.config.max_target_positions // 2 - 1
        # only the tail counts: tokenize no more of it than those tokens take (8 characters
        # a token is generous), so a megabyte of prompt costs the engine nothing
        ids = self.tokenizer.get_prompt_ids(prompt[-keep * 8:], return_tensors="pt")
        if len(ids) > keep + 1:
            ids = torch.cat([ids[:1], ids[-keep:]])
        return ids.to(self.device)

    def _result(self, ids: list[int], seconds: float, language: str,
                params: Mapping[str, Any]) -> dict[str, Any]:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        segment = {"id": 0, "seek": 0, "start": 0.0, "end": round(seconds, 3), "text": text,
                   "tokens": ids, "temperature": float(params.get("temperature") or 0.0),
                   "avg_logprob": 0.0, "compression_ratio": 0.0, "no_speech_prob": 0.0}
        return {"text": text.strip(), "segments": [segment], "language": language,
                "language_name": _language_name(language), "duration": round(seconds, 3)}

    def _check(self, params: Mapping[str, Any]) -> None:
        language = params.get("language") or None
        if language is not None and language not in self.languages:
            raise ValueError(f"this Whisper model understands {', '.join(self.languages[:8])}"
                             f"{' ...' if len(self.languages) > 8 else ''}; not '{language}'")
        if params.get("word_timestamps"):
            raise ValueError("word timestamps are not reported by this Whisper runner "
                             "(timestamp_granularities: segment)")


def build_whisper_hf_runner(*, model_dir: str | None, device: str, dtype: str,
                            options: Mapping[str, Any]) -> WhisperHFRunner:
    if not is_hf_whisper(model_dir):
        raise EngineLoadError(f"model 'whisper_hf' needs a model_dir holding a transformers "
                              f"Whisper config.json (model_type whisper), got {model_dir!r}")
    return WhisperHFRunner(str(model_dir), device, dtype, options)
