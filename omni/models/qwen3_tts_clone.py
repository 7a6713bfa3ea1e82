"""Qwen3-TTS Base releases: the voice of a reference clip, as qwen-tts clones it.

A Base release has no speakers (config.json ``spk_id`` is empty) and carries a speaker
encoder (an ECAPA-TDNN over 128-bin mels of 24 kHz audio) beside the talker; its
``speech_tokenizer/`` also encodes (Mimi's encoder: reference audio -> codec codes).
qwen-tts's ``create_voice_clone_prompt`` turns (reference audio, its transcript) into a
prompt item: the speaker embedding, plus the reference's codes when the transcript is
given (in-context mode: the talker continues the reference). Without a transcript the
embedding alone clones the voice (qwen-tts's ``x_vector_only_mode``).

Building a prompt runs both encoders over the clip, so prompts are kept per distinct
reference (its samples, rate and transcript) within the process, the least recently used
dropped beyond ``capacity``: a client that sends the same reference with every sentence
or request pays for it once.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

DEFAULT_CAPACITY = 64  # prompts kept: a prompt is the reference's codes + one embedding
MIN_REFERENCE_S = 0.5  # shorter clips give the speaker encoder too few mel frames
MAX_REFERENCE_S = 30.0  # qwen-tts's model card asks for a few seconds; longer costs prefill


def reference_of(params: Mapping[str, Any]) -> tuple[np.ndarray, int, str | None]:
    """(samples, rate, transcript) of a request's reference (speech_reference.py's shape);
    ValueError naming the field when it is missing or malformed."""
    ref = params.get("ref_audio")
    if not isinstance(ref, Mapping) or not isinstance(ref.get("pcm_f32le"), bytes | bytearray):
        raise ValueError("ref_audio: this Qwen3-TTS release clones a voice: the request "
                         "needs a reference clip")
    samples = np.frombuffer(ref["pcm_f32le"], dtype=np.float32)
    if not samples.size:
        raise ValueError("ref_audio: the reference holds no samples")
    text = params.get("ref_text")
    return samples, int(ref.get("sample_rate", 0)), str(text) if text else None


class VoiceClones:
    """qwen-tts's voice-clone prompt items, one per distinct reference, bounded (LRU)."""

    def __init__(self, tts: Any, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"clone_cache_size must be >= 1, got {capacity}")
        self.tts = tts
        self.capacity = capacity
        self._items: OrderedDict[str, Any] = OrderedDict()
        self.built = 0  # prompts made (tests and info: how often the cache missed)

    def prompt(self, params: Mapping[str, Any]) -> Any:
        samples, rate, text = reference_of(params)
        key = self._key(samples, rate, text)
        item = self._items.get(key)
        if item is None:
            item = self._build(samples, rate, text)
            self._items[key] = item
            if len(self._items) > self.capacity:
                self._items.popitem(last=False)
        self._items.move_to_end(key)
        return item

    def _build(self, samples: np.ndarray, rate: int, text: str | None) -> Any:
        self.built += 1
        # the same call as qwen-tts's generate_voice_clone(ref_audio=(wav, sr), ref_text=...)
        items = self.tts.create_voice_clone_prompt(
            ref_audio=(samples, rate), ref_text=text, x_vector_only_mode=text is None)
        return items[0]

    @staticmethod
    def _key(samples: np.ndarray, rate: int, text: str | None) -> str:
        digest = hashlib.blake2b(samples.tobytes(), digest_size=16)
        digest.update(f"|{rate}|{text!r}".encode())
        return digest.hexdigest()

    def __len__(self) -> int:
        return len(self._items)
