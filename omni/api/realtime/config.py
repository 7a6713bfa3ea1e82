"""A realtime session's settings, read from either dialect and written back in it.

The OpenAI realtime API has two shapes of one session (protocols.md §5.2-5.3): GA
(``session.type: "realtime"``, ``output_modalities``, ``audio.input/output``) and beta
(flat: ``modalities``, ``voice``, ``input_audio_format``, ``turn_detection``). The
connection speaks one dialect (beta when the client sent ``OpenAI-Beta: realtime=v1``);
``session.update`` is read in whichever shape it comes, since a client of either SDK may
send the other's keys. Audio is pcm16 at 24 kHz both ways (the only format served).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

AUDIO_RATE = 24_000  # realtime pcm16, in and out
VAD_DEFAULTS = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                "silence_duration_ms": 500, "create_response": True,
                "interrupt_response": True}
# semantic_vad's eagerness as the silence (ms) that ends a turn: omni has no model of
# whether an utterance is finished, so "less eager" means "waits longer in a pause"
# (docs/realtime.md, "Turn detection"); auto is medium, as OpenAI's
EAGERNESS_SILENCE_MS = {"low": 1500, "medium": 800, "auto": 800, "high": 300}


class ClientError(Exception):
    """A client event the server cannot take: an ``error`` event, the socket stays."""

    def __init__(self, message: str, code: str = "invalid_event", param: str | None = None):
        super().__init__(message)
        self.code, self.param = code, param


class ConfigError(ValueError):
    """A session setting the server cannot honour; ``param`` names it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class ToolSettings:
    """A session's (or one response's) tools as the client set them, echoed in
    session.created / .updated, and their plan for the engine (omni/api/tools.py
    ToolPlan; None: no tools). Read and checked by tools.py."""

    tools: list[dict[str, Any]] = field(default_factory=list)
    choice: str | dict[str, Any] = "auto"
    plan: Any = None


@dataclass
class SessionConfig:
    model: str
    output_modalities: list[str]  # ["audio"] (speech + its transcript) or ["text"]
    voice: str | None
    voices: tuple[str, ...] = ()  # what the model offers; empty: not known / no audio
    instructions: str = ""
    turn_detection: dict[str, Any] | None = field(default_factory=lambda: dict(VAD_DEFAULTS))
    transcription: dict[str, Any] | None = None
    max_output_tokens: int | str = "inf"
    temperature: float | None = None
    tools: ToolSettings = field(default_factory=ToolSettings)
    kind: str = "realtime"  # or "transcription" (transcription.py): no responses

    # -- reading ---------------------------------------------------------------------
    def update(self, raw: Any) -> None:
        """Merge a session.update's ``session``; ConfigError leaves nothing changed."""
        if not isinstance(raw, dict):
            raise ConfigError("'session' must be an object", "session")
        audio = raw.get("audio") if isinstance(raw.get("audio"), dict) else {}
        audio_in = audio.get("input") if isinstance(audio.get("input"), dict) else {}
        audio_out = audio.get("output") if isinstance(audio.get("output"), dict) else {}
        changes: dict[str, Any] = {}
        modalities = raw.get("output_modalities", raw.get("modalities"))
        if modalities is not None:
            changes["output_modalities"] = _modalities(modalities, self.voices)
        voice = audio_out.get("voice", raw.get("voice"))
        if voice is not None:
            if not isinstance(voice, str) or (self.voices and voice not in self.voices):
                raise ConfigError(f"unknown voice {voice!r}; the voices are "
                                  f"{', '.join(self.voices) or 'none'}", "session.voice")
            changes["voice"] = voice
        for fmt, param in ((audio_in.get("format"), "session.audio.input.format"),
                           (raw.get("input_audio_format"), "session.input_audio_format"),
                           (audio_out.get("format"), "session.audio.output.format"),
                           (raw.get("output_audio_format"), "session.output_audio_format")):
            _check_format(fmt, param)
        if "instructions" in raw:
            if not isinstance(raw["instructions"], str):
                raise ConfigError("'instructions' must be a string", "session.instructions")
            changes["instructions"] = raw["instructions"]
        for source in (raw, audio_in):
            if "turn_detection" in source:
                changes["turn_detection"] = _turn_detection(source["turn_detection"])
        if "transcription" in audio_in or "input_audio_transcription" in raw:
            changes["transcription"] = _transcription(audio_in.get(
                "transcription", raw.get("input_audio_transcription")))
        limit = raw.get("max_output_tokens", raw.get("max_response_output_tokens"))
        if limit is not None:
            changes["max_output_tokens"] = max_tokens(limit, "session.max_output_tokens")
        if raw.get("temperature") is not None:
            changes["temperature"] = temperature(raw["temperature"])
        if self.kind == "transcription" and changes.get("turn_detection"):
            # a transcription session never answers: the VAD only ends turns
            changes["turn_detection"].update(create_response=False, interrupt_response=False)
        for key, value in changes.items():
            setattr(self, key, value)

    # -- writing ---------------------------------------------------------------------
    def render(self, session_id: str, beta: bool) -> dict[str, Any]:
        fmt = {"type": "audio/pcm", "rate": AUDIO_RATE}
        if self.kind == "transcription":
            return self._render_transcription(session_id, beta, fmt)
        if beta:
            return {"id": session_id, "object": "realtime.session", "model": self.model,
                    "modalities": (["text", "audio"] if "audio" in self.output_modalities
                                   else ["text"]),
                    "instructions": self.instructions, "voice": self.voice,
                    "input_audio_format": "pcm16", "output_audio_format": "pcm16",
                    "input_audio_transcription": self.transcription,
                    "turn_detection": self.turn_detection, "tools": self.tools.tools,
                    "tool_choice": self.tools.choice,
                    "temperature": 0.8 if self.temperature is None else self.temperature,
                    "max_response_output_tokens": self.max_output_tokens}
        return {"type": "realtime", "object": "realtime.session", "id": session_id,
                "model": self.model, "output_modalities": list(self.output_modalities),
                "instructions": self.instructions,
                "audio": {"input": {"format": fmt, "transcription": self.transcription,
                                    "noise_reduction": None,
                                    "turn_detection": self.turn_detection},
                          "output": {"format": fmt, "voice": self.voice, "speed": 1.0}},
                "tools": self.tools.tools, "tool_choice": self.tools.choice,
                "max_output_tokens": self.max_output_tokens}

    def _render_transcription(self, session_id: str, beta: bool,
                              fmt: dict[str, Any]) -> dict[str, Any]:
        if beta:  # protocols.md §10.11: the flat transcription_session shape
            return {"id": session_id, "object": "realtime.transcription_session",
                    "modalities": ["text"], "input_audio_format": "pcm16",
                    "input_audio_transcription": self.transcription,
                    "turn_detection": self.turn_detection,
                    "input_audio_noise_reduction": None, "include": []}
        return {"type": "transcription", "object": "realtime.transcription_session",
                "id": session_id, "include": [],
                "audio": {"input": {"format": fmt, "transcription": self.transcription,
                                    "noise_reduction": None,
                                    "turn_detection": self.turn_detection}}}


def _modalities(value: Any, voices: tuple[str, ...]) -> list[str]:
    if not isinstance(value, list) or not value or not all(v in ("text", "audio")
                                                           for v in value):
        raise ConfigError("output modalities are [\"audio\"] or [\"text\"]",
                          "session.output_modalities")
    if "audio" in value and not voices:
        raise ConfigError("this model does not speak; use [\"text\"]",
                          "session.output_modalities")
    return ["audio"] if "audio" in value else ["text"]


def _transcription(value: Any) -> dict[str, Any] | None:
    if value is not None and not isinstance(value, dict):
        raise ConfigError("transcription is {\"model\", \"language\", \"prompt\"} or null",
                          "session.audio.input.transcription")
    return value


def _check_format(fmt: Any, param: str) -> None:
    if fmt is None or fmt == "pcm16":
        return
    if isinstance(fmt, dict) and fmt.get("type") == "audio/pcm" \
            and fmt.get("rate", AUDIO_RATE) == AUDIO_RATE:
        return
    raise ConfigError(f"audio format {fmt!r} is not served; use pcm16 at 24 kHz "
                      "(GA: {\"type\": \"audio/pcm\", \"rate\": 24000})", param)


def _turn_detection(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    kind = value.get("type", "server_vad") if isinstance(value, dict) else None
    if kind == "semantic_vad":
        return _semantic_vad(value)
    if kind != "server_vad":
        raise ConfigError("turn_detection is {\"type\": \"server_vad\", ...}, "
                          "{\"type\": \"semantic_vad\", \"eagerness\": ...} or null",
                          "session.turn_detection")
    merged = {**VAD_DEFAULTS, **{k: v for k, v in value.items() if v is not None}}
    if not (isinstance(merged["threshold"], int | float) and 0 <= merged["threshold"] <= 1):
        raise ConfigError("turn_detection.threshold is a number in [0, 1]",
                          "session.turn_detection.threshold")
    for key in ("prefix_padding_ms", "silence_duration_ms"):
        if not isinstance(merged[key], int) or not 0 <= merged[key] <= 10_000:
            raise ConfigError(f"turn_detection.{key} is an integer in [0, 10000]",
                              f"session.turn_detection.{key}")
    return merged


def _semantic_vad(value: dict[str, Any]) -> dict[str, Any]:
    """semantic_vad as the server VAD's settings its eagerness maps to; the echo carries
    them, so a client sees what the VAD does. Threshold, padding and silence sent with it
    are not OpenAI's and are recomputed (a client may send back the session it was shown)."""
    eagerness = value.get("eagerness") or "auto"
    if eagerness not in EAGERNESS_SILENCE_MS:
        raise ConfigError(f"turn_detection.eagerness is one of low, medium, high, auto "
                          f"(got {eagerness!r})", "session.turn_detection.eagerness")
    flags = {}
    for key in ("create_response", "interrupt_response"):
        flag = value.get(key)
        if flag is not None and not isinstance(flag, bool):
            raise ConfigError(f"turn_detection.{key} is a boolean",
                              f"session.turn_detection.{key}")
        flags[key] = VAD_DEFAULTS[key] if flag is None else flag
    return {"type": "semantic_vad", "eagerness": eagerness, **flags,
            "threshold": VAD_DEFAULTS["threshold"],
            "prefix_padding_ms": VAD_DEFAULTS["prefix_padding_ms"],
            "silence_duration_ms": EAGERNESS_SILENCE_MS[eagerness]}


def max_tokens(value: Any, param: str) -> int | str:
    if value == "inf":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
        raise ConfigError("max output tokens is an integer in [1, 4096] or \"inf\"", param)
    return value


def temperature(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 2:
        raise ConfigError("temperature is a number in [0, 2]", "session.temperature")
    return float(value)
