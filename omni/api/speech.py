"""POST /v1/audio/speech and GET /v1/audio/voices (protocols.md §2).

The pipeline streams one audio output per sentence (float32 at the voice's rate); this
module checks the request, encodes the audio into the asked format as it arrives
(omni/media/audio.py) and sends it whole, as a chunked byte stream (``stream_format``
``audio``) or as SSE events (``sse``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from omni.api.errors import APIError, read_json, sse_error_event
from omni.api.schemas import parse
from omni.api.schemas.speech import SpeechRequest
from omni.api.speech_reference import clone_spec, reference_inputs
from omni.api.state import METRICS_KEY, MODELS_KEY, SETTINGS_KEY, ServedModel, live_output_info
from omni.api.streams import first_output, next_with_pings, sse_data, start_sse
from omni.media.audio import AudioEncoder
from omni.media.playback import PlaybackClock
from omni.models.speech import OPENAI_VOICES

log = logging.getLogger("omni.api.speech")


@dataclass
class SpeechUsage:
    input_tokens: int = 0
    output_tokens: int = 0
    samples: int = 0

    def add(self, data: dict[str, Any]) -> None:
        self.input_tokens += int(data.get("input_tokens", 0))
        self.output_tokens += int(data.get("output_tokens", 0))
        self.samples += int(data.get("samples", 0))

    def body(self) -> dict[str, int]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "total_tokens": self.input_tokens + self.output_tokens}


@dataclass
class SpeechCall:
    """One checked speech request (see `parse_speech`)."""

    request: web.Request
    model: ServedModel
    text: str
    voice: str
    format: str
    speed: float
    stream_format: str | None
    sample_rate: int
    instructions: str | None = None
    ref_text: str | None = None  # a voice-clone model's reference (omni/api/speech_reference.py)
    seed: int | None = None  # a sampling model's draws
    inputs: dict[str, Any] = field(default_factory=dict)  # engine inputs beside the text
    id: str = field(default_factory=lambda: f"speech-{uuid.uuid4().hex}")
    usage: SpeechUsage = field(default_factory=SpeechUsage)
    clock: PlaybackClock = field(default_factory=PlaybackClock)

    @property
    def client_request_id(self) -> str:
        return self.request.headers.get("X-Request-Id") or self.id

    def stream(self) -> Any:
        params: dict[str, Any] = {"speed": self.speed, "voice": self.voice}
        if self.instructions:
            params["instructions"] = self.instructions
        if self.ref_text:
            params["ref_text"] = self.ref_text
        if self.seed is not None:
            params["seed"] = self.seed
        return self.model.omni.generate({"text": self.text, **self.inputs}, modalities=["audio"],
                                        params={"*": params}, request_id=self.id)

    def encoder(self, streaming: bool) -> AudioEncoder:
        return AudioEncoder(self.format, self.sample_rate, streaming)

    async def encode(self, encoder: AudioEncoder, data: dict[str, Any] | None) -> bytes:
        """The bytes one output completes (codec work off the event loop)."""
        if not data or not data.get("samples"):
            return b""
        if int(data.get("sample_rate", self.sample_rate)) != self.sample_rate:
            raise RuntimeError(f"stage changed sample rate mid-request "
                               f"({data.get('sample_rate')} != {self.sample_rate})")
        self.usage.add(data)
        self.clock.audio(int(data["samples"]) / int(data.get("sample_rate", self.sample_rate)))
        samples = data["audio"].numpy()
        if encoder.format.container is None:  # wav/pcm: a cheap numpy conversion
            return encoder.encode(samples)
        return await asyncio.to_thread(encoder.encode, samples)

    def observe(self) -> None:
        """TTFP, RTF and underrun of this request, on /metrics."""
        self.request.app[METRICS_KEY].observe_playback(self.model.id, self.clock.summary())

    async def finish(self, encoder: AudioEncoder) -> bytes:
        if encoder.format.container is None:
            return encoder.finish()
        return await asyncio.to_thread(encoder.finish)


# -- request checking ---------------------------------------------------------------
def audio_model(request: web.Request, model_id: Any) -> ServedModel:
    models = request.app[MODELS_KEY]
    model = models.get(model_id)
    if "audio" not in model.modalities:
        speaking = [m.id for m in models.producing("audio")]
        raise APIError(400, f"model '{model.id}' does not output audio (it outputs "
                       f"{', '.join(model.modalities)}); models with audio: "
                       f"{', '.join(speaking) or 'none'}", param="model")
    return model


def audio_info(model: ServedModel) -> dict[str, Any]:
    return live_output_info(model, "audio")


def resolve_voice(model: ServedModel, voice: Any, info: dict[str, Any]) -> str:
    """The model's voice id a request names; OpenAI's names only where the model maps them."""
    if isinstance(voice, dict):
        voice = voice.get("id")
    voices = list(info.get("voices") or ())
    ids = [v["id"] for v in voices]
    names = [v.get("name") or v["id"] for v in voices]
    # listed as users know them: Qwen3-Omni's "Ethan" (its config says "ethan"), Piper's
    # "en_US-joe-medium (joe)"
    labels = ", ".join(n if n.casefold() == i.casefold() else f"{i} ({n})"
                       for i, n in zip(ids, names, strict=True))
    if not isinstance(voice, str) or not voice:
        raise APIError(400, f"'voice' is required: one of {labels}", param="voice")
    if voice in ids:
        return voice
    by_case = {i.casefold(): i for i in ids} | {
        n.casefold(): i for n, i in zip(names, ids, strict=True)}
    if voice.casefold() in by_case:  # voice names are matched case-insensitively
        return by_case[voice.casefold()]
    alias = info.get("openai_voice_alias")
    if alias and voice.lower() in OPENAI_VOICES:
        return alias
    hint = (f" (OpenAI's voice names map to '{alias}' on this model)" if alias else "")
    raise APIError(400, f"unknown voice '{voice}' for model '{model.id}'; valid voices: "
                   f"{labels}{hint}", param="voice")


def _text(req: SpeechRequest, limit: int) -> str:
    """The input, checked; ``instructions`` too, to the same limit: a model reads them
    beside every sentence it speaks (an instruct prompt in each batched row), so
    an unbounded one costs every request batched with it."""
    for param, value in (("input", req.input), ("instructions", req.instructions or "")):
        if len(value) > limit:
            raise APIError(400, f"'{param}' is {len(value)} characters; the limit is {limit}",
                           param=param, code="string_above_max_length")
    return req.input


def parse_speech(request: web.Request, body: dict[str, Any]) -> SpeechCall:
    req = parse(SpeechRequest, body)
    model = audio_model(request, req.model)
    pipeline = model.omni.pipeline
    if set(pipeline.route(["audio"]).stages) & set(pipeline.outputs.get("text", ())):
        raise APIError(400, f"model '{model.id}' speaks its own answers, it does not read "
                       "text aloud; use /v1/chat/completions with \"modalities\": [\"text\", "
                       "\"audio\"]", param="model")
    text = _text(req, request.app[SETTINGS_KEY].max_speech_chars)
    info = audio_info(model)
    # a voice-clone model speaks in the reference's voice: `voice` (the OpenAI SDK always
    # sends one) is not one of its voices and is not checked
    voice = "" if clone_spec(info) else resolve_voice(model, req.voice, info)
    return SpeechCall(request, model, text, voice, req.response_format or "mp3",
                      req.speed or 1.0, req.stream_format, int(info["sample_rate"]),
                      req.instructions or None, req.ref_text, req.seed)


# -- responses ----------------------------------------------------------------------
async def _whole(call: SpeechCall) -> web.Response:
    encoder = call.encoder(streaming=False)
    parts = []
    try:
        async with contextlib.aclosing(call.stream()) as outputs:
            async for out in outputs:
                if out.modality == "audio":
                    parts.append(await call.encode(encoder, out.data))
        parts.append(await call.finish(encoder))
    finally:
        encoder.close()
    call.observe()
    seconds = call.usage.samples / call.sample_rate
    return web.Response(body=b"".join(parts), content_type=encoder.content_type, headers={
        "X-Request-Id": call.client_request_id, "X-Audio-Duration": f"{seconds:.4f}"})


async def _encoded(call: SpeechCall, outputs: Any, item: Any, encoder: AudioEncoder,
                   next_item: Any) -> AsyncIterator[bytes]:
    """The encoded bytes of a started stream, chunk by chunk, the encoder's tail last;
    next_item(outputs) awaits the next output (None at the end)."""
    async with contextlib.aclosing(outputs):
        while item is not None:
            if item.modality == "audio":
                chunk = await call.encode(encoder, item.data)
                if chunk:
                    yield chunk
            item = None if item.finished else await next_item(outputs)
    tail = await call.finish(encoder)
    call.observe()
    if tail:
        yield tail


async def _audio_stream(call: SpeechCall) -> web.StreamResponse:
    outputs = call.stream()
    item = await first_output(outputs)  # errors before the 200 become proper statuses
    encoder = call.encoder(streaming=True)
    response = web.StreamResponse(headers={"Content-Type": encoder.content_type,
                                           "X-Request-Id": call.client_request_id})
    response.enable_chunked_encoding()
    await response.prepare(call.request)
    try:
        async with contextlib.aclosing(_encoded(call, outputs, item, encoder,
                                                lambda o: anext(o, None))) as chunks:
            async for chunk in chunks:  # leaving early closes chunks, which aborts
                await response.write(chunk)
    except (ConnectionResetError, ConnectionError):
        raise  # the client left; closing the outputs already aborted the request
    except Exception as exc:
        # a raw audio stream has no way to carry an error: cut the connection, so the
        # client sees an incomplete body instead of audio that silently stops early
        log.error("speech %s failed after the stream started: %s", call.id, exc)
        if call.request.transport is not None:
            call.request.transport.close()
    finally:
        encoder.close()
    return response


async def _sse_stream(call: SpeechCall) -> web.StreamResponse:
    outputs = call.stream()
    item = await first_output(outputs)
    encoder = call.encoder(streaming=True)
    response = await start_sse(call.request, call.client_request_id)
    try:
        async with contextlib.aclosing(_encoded(call, outputs, item, encoder,
                                                lambda o: next_with_pings(o, response))) as chunks:
            async for chunk in chunks:
                await response.write(sse_data({"type": "speech.audio.delta",
                                               "audio": base64.b64encode(chunk).decode()}))
        await response.write(sse_data({"type": "speech.audio.done", "usage": call.usage.body()}))
    except (ConnectionResetError, ConnectionError):
        raise
    except Exception as exc:
        log.error("speech %s failed after the stream started: %s", call.id, exc)
        await response.write(sse_error_event(exc, event_type="error"))
    finally:
        encoder.close()
    return response


async def speech(request: web.Request) -> web.StreamResponse:
    body = await read_json(request)
    call = parse_speech(request, body)
    call.inputs = await reference_inputs(request, call.model.id, body.get("ref_audio"),
                                         call.ref_text, audio_info(call.model))
    if call.stream_format == "sse":
        return await _sse_stream(call)
    if call.stream_format == "audio":
        return await _audio_stream(call)
    return await _whole(call)


async def voices(request: web.Request) -> web.Response:
    """{"voices": [{id, name, language, sample_rate}]} of one model (?model=) or of every
    model with audio output (each entry then names its model)."""
    models = request.app[MODELS_KEY]
    wanted = request.query.get("model")
    if wanted is not None:
        model = audio_model(request, wanted)
        return web.json_response({"voices": audio_info(model).get("voices", [])})
    speaking = models.producing("audio")
    if not speaking:
        raise APIError(404, f"no served model outputs audio. Served models: {models.listing()}",
                       code="model_not_found", param="model")
    return web.json_response({"voices": [{**v, "model": m.id} for m in speaking
                                         for v in audio_info(m).get("voices", [])]})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get("/v1/audio/voices", voices)
