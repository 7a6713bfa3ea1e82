"""What every text-to-speech adapter shares: the runner contract, params and outputs.

A TTS model is served as a ``generation`` stage in items mode (omni/engines/generation/engine.py):

- input ``text`` (a string or a list of strings); ``split(text, params)`` cuts it into
  sentences (units), so long input streams sentence by sentence and nothing is dropped;
- per-request params: ``speed`` (0.25-4.0, 1.0 = the model's pace), ``voice`` (one of the
  ids in ``info()["voices"]``; absent = the first), ``instructions`` (a style prompt,
  used only by models that take one);
- one output per sentence, ``speech_output(...)``: ``audio`` (float32 mono tensor in
  [-1, 1]), ``sample_rate``, ``samples``, ``input_tokens`` (ids the model read),
  ``output_tokens`` (acoustic frames it produced);
- ``info()`` has ``sample_rate``, ``voices`` (``voice_entry`` dicts, the shape
  ``GET /v1/audio/voices`` returns for every model) and ``openai_voice_alias``: the voice
  OpenAI's built-in names (alloy, echo, ...) stand for, or None when the model does not
  accept them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

SPEED_MIN = 0.25
SPEED_MAX = 4.0
# OpenAI's built-in voice names (speech API + chat audio), accepted only by models whose
# info() names an openai_voice_alias
OPENAI_VOICES = frozenset({"alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx",
                           "sage", "shimmer", "verse", "marin", "cedar"})
# a sentence ends at . ! ? (and their CJK forms) or a line break, followed by space
_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+|\n+")


def check_speed(speed: Any) -> float:
    """speed (0.25-4.0, as OpenAI's speech API) as a float; ValueError otherwise."""
    if isinstance(speed, bool) or not isinstance(speed, int | float) or not (
            SPEED_MIN <= speed <= SPEED_MAX):
        raise ValueError(f"speed must be a number in [{SPEED_MIN}, {SPEED_MAX}], got {speed!r}")
    return float(speed)


def texts(value: Any) -> list[str]:
    """A request's text input as a list of non-blank strings; ValueError otherwise."""
    if isinstance(value, str):
        parts = [value]
    elif isinstance(value, Sequence) and all(isinstance(t, str) for t in value):
        parts = list(value)
    else:
        raise ValueError(f"text must be a string or a list of strings, got {type(value).__name__}")
    parts = [p for p in parts if p.strip()]
    if not parts:
        raise ValueError("text has nothing to synthesize")
    return parts


def split_sentences(text: str, max_chars: int) -> list[str]:
    """Sentences of text, each at most max_chars (longer ones cut at word boundaries,
    a single over-long word cut hard); for models without their own sentence splitter."""
    out: list[str] = []
    for sentence in _SENTENCE_END.split(text):
        sentence = sentence.strip()
        while len(sentence) > max_chars:
            cut = sentence.rfind(" ", 1, max_chars + 1)
            cut = cut if cut > 0 else max_chars
            out.append(sentence[:cut].strip())
            sentence = sentence[cut:].strip()
        if sentence:
            out.append(sentence)
    return out


def ended_sentences(text: str) -> tuple[str, str]:
    """(the text up to the last sentence end, the rest): streamed text is spoken a whole
    sentence at a time, so a voice never reads half a sentence with a falling tone.

    Text that stops right at . ! ? counts as ended unless the word before it reads like a
    number, an initial or an abbreviation ("3.", "J.", "Dr."): waiting for the space an
    LLM would send next costs a whole decode step before the first audio, and for a
    one-sentence answer the space never comes (the stream ends after the full stop)."""
    if _ends_at_terminal(text):
        return text, ""
    ends = list(_SENTENCE_END.finditer(text))
    if not ends:
        return "", text
    cut = ends[-1].end()
    return text[:cut], text[cut:]


_ABBREVIATIONS = frozenset({"mr", "mrs", "ms", "dr", "st", "vs", "etc", "prof", "sr", "jr",
                            "e.g", "i.e", "no", "fig", "approx", "inc", "ltd", "co"})


def _ends_at_terminal(text: str) -> bool:
    if not text or text[-1] not in ".!?。！？":
        return False
    if text[-1] in "!?。！？":
        return True
    words = text[:-1].split()
    word = words[-1].lower() if words else ""
    return bool(word) and not word[-1].isdigit() and len(word) > 1 \
        and word not in _ABBREVIATIONS


def voice_entry(voice_id: str, name: str, language: str, sample_rate: int) -> dict[str, Any]:
    return {"id": voice_id, "name": name, "language": language, "sample_rate": sample_rate}


def pick_voice(params: Mapping[str, Any], voices: list[dict[str, Any]]) -> str:
    """The voice id a request asks for (absent: the model's first voice); ValueError
    naming the valid ids otherwise."""
    voice = params.get("voice")
    if voice is None:
        return voices[0]["id"]
    ids = [v["id"] for v in voices]
    if voice not in ids:
        raise ValueError(f"unknown voice {voice!r} (valid: {', '.join(ids)})")
    return voice


def speech_output(audio: Any, sample_rate: int, input_tokens: int,
                  output_tokens: int) -> dict[str, Any]:
    """One sentence's output fields (see module docstring)."""
    return {"audio": audio, "sample_rate": sample_rate, "samples": int(audio.numel()),
            "input_tokens": int(input_tokens), "output_tokens": int(output_tokens)}
