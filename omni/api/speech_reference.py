"""The reference voice of a /v1/audio/speech request (this server's extension fields).

A model that clones a voice from a reference clip says so in its audio output info:
``voice_clone: {"sample_rate": R, "min_seconds": a, "max_seconds": b}``. Its requests
carry ``ref_audio`` (a base64 audio file, or a data: / http(s) URL of one, fetched under
--media-fetch as chat audio is) and optionally ``ref_text`` (what the clip says). The clip
is decoded here, off the event loop, to float32 mono at R and checked against [a, b]
seconds; it rides to the engine as ``{"pcm_f32le": bytes, "sample_rate": R}`` beside the
text (request media go through the payload plane, omni/runtime/request_media.py). A model
without ``voice_clone`` refuses ``ref_audio``; one with it requires it. Every problem is a
400 naming the field.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Any

from aiohttp import web

from omni.api.errors import APIError
from omni.api.state import SETTINGS_KEY
from omni.media import fetch
from omni.media.audio import decode_audio


def clone_spec(info: dict[str, Any]) -> dict[str, Any] | None:
    """The model's voice-clone limits, None when it speaks only its own voices."""
    spec = info.get("voice_clone")
    return spec if isinstance(spec, dict) else None


async def reference_inputs(request: web.Request, model_id: str, ref_audio: str | None,
                           ref_text: str | None, info: dict[str, Any]) -> dict[str, Any]:
    """The engine inputs the reference adds ({} for a model that does not clone)."""
    spec = clone_spec(info)
    if spec is None:
        if ref_audio is not None or ref_text is not None:
            field = "ref_audio" if ref_audio is not None else "ref_text"
            raise APIError(400, f"model '{model_id}' speaks its own voices (GET "
                           "/v1/audio/voices) and does not clone one from a reference",
                           param=field)
        return {}
    if ref_audio is None:
        raise APIError(400, f"model '{model_id}' clones the voice of a reference clip: "
                       "'ref_audio' is required (base64 audio or a data: URL; add "
                       "'ref_text', the clip's words, for the closest likeness)",
                       param="ref_audio")
    data = await _reference_bytes(request, ref_audio)
    rate = int(spec["sample_rate"])
    samples = await _decode(data, rate, float(spec["max_seconds"]))
    seconds = samples.size / rate
    if seconds < float(spec["min_seconds"]):
        raise APIError(400, f"'ref_audio' lasts {seconds:.2f} s; a reference needs at least "
                       f"{float(spec['min_seconds']):g} s", param="ref_audio")
    return {"ref_audio": {"pcm_f32le": samples.tobytes(), "sample_rate": rate}}


async def _reference_bytes(request: web.Request, ref_audio: str) -> bytes:
    policy = request.app[SETTINGS_KEY].media_fetch
    if ref_audio.startswith(("data:", "http://", "https://")):
        try:
            return (await fetch.load(ref_audio, policy)).data
        except fetch.MediaError as e:
            raise APIError(400, f"'ref_audio': {e}", param="ref_audio") from None
    if len(ref_audio) > policy.max_bytes * 4 // 3 + 4:
        raise APIError(400, f"'ref_audio' is larger than {policy.max_bytes} bytes",
                       param="ref_audio")
    try:
        return base64.b64decode(ref_audio, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, "'ref_audio' is neither base64 audio nor a data: / http(s) URL",
                       param="ref_audio") from None


async def _decode(data: bytes, rate: int, max_seconds: float) -> Any:
    try:
        return await asyncio.to_thread(decode_audio, data, rate, max_seconds)
    except ValueError as e:
        raise APIError(400, f"'ref_audio' is not usable audio: {e}", param="ref_audio") from None
