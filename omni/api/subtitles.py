"""A transcription in each ``response_format`` of /v1/audio/transcriptions (protocols.md
§9.2): JSON shapes for json and verbose_json, raw text for text, srt and vtt (never a
JSON-quoted string: the SDK hands those bodies to the user as they are)."""

from __future__ import annotations

from typing import Any

FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
TEXT_TYPES = {"text": "text/plain", "srt": "text/plain", "vtt": "text/vtt"}


def render(fmt: str, result: dict[str, Any], words: bool) -> tuple[Any, str]:
    """(body, content type): a dict for the JSON formats, else a string."""
    text, segments = result["text"], result["segments"]
    if fmt == "json":
        return {"text": text, "usage": _usage(result)}, "application/json"
    if fmt == "verbose_json":
        body = {"task": "transcribe",
                # the runner's name of it (OpenAI's verbose_json says "english", not "en")
                "language": result.get("language_name") or result["language"],
                "duration": result["duration"], "text": text,
                "segments": [{k: v for k, v in s.items() if k != "words"} for s in segments],
                "usage": _usage(result)}
        if words:
            body["words"] = [w for s in segments for w in s.get("words", ())]
        return body, "application/json"
    if fmt == "text":
        return text + "\n", TEXT_TYPES[fmt]
    cues = [(s["start"], s["end"], s["text"].strip()) for s in segments if s["text"].strip()]
    if fmt == "srt":
        return "".join(f"{i}\n{_clock(a, ',')} --> {_clock(b, ',')}\n{t}\n\n"
                       for i, (a, b, t) in enumerate(cues, 1)), TEXT_TYPES[fmt]
    return "WEBVTT\n\n" + "".join(f"{_clock(a, '.')} --> {_clock(b, '.')}\n{t}\n\n"
                                  for a, b, t in cues), TEXT_TYPES[fmt]


def stream_deltas(result: dict[str, Any]) -> list[str]:
    """The transcript cut at its segments' ends: joined, exactly ``result["text"]``."""
    raw = "".join(s["text"] for s in result["segments"])
    text = result["text"]
    lead, start, end, out = len(raw) - len(raw.lstrip()), 0, 0, []
    for segment in result["segments"]:
        end += len(segment["text"])
        stop = min(max(end - lead, 0), len(text))
        if stop > start:
            out.append(text[start:stop])
            start = stop
    if start < len(text):
        out.append(text[start:])
    return out


def _usage(result: dict[str, Any]) -> dict[str, Any]:
    return {"type": "duration", "seconds": max(1, round(result["duration"]))}


def _clock(seconds: float, mark: str) -> str:
    ms = max(0, round(seconds * 1000))
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{mark}{ms:03d}"
