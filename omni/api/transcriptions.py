"""POST /v1/audio/transcriptions and /v1/audio/translations (protocols.md §9).

The form is read as a stream (the file part is counted against --max-audio-mb, not the
JSON body limit), the file is decoded off the event loop to 16 kHz mono (any container
PyAV reads, checked against --max-audio-seconds), and the served model's audio-input
stage (a runner that reports ``task: transcription``) returns the text and its segments
(and the language's name, ``language_name``), shaped here into the
asked ``response_format``. With ``stream=true`` the reply is SSE: one
``transcript.text.delta`` per segment, then ``transcript.text.done``; the transcript comes
back whole from the stage, so the stream starts when it is known (a failure before that
is a plain error status, as the SDK expects).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import BodyPartReader, web

from omni.api.errors import APIError
from omni.api.schemas import parse as schema_parse
from omni.api.schemas.media import TranscriptionForm
from omni.api.state import MODELS_KEY, SETTINGS_KEY, ServedModel, live_output_info
from omni.api.streams import sse_data, start_sse
from omni.api.subtitles import render, stream_deltas
from omni.media.audio import decode_audio, pcm16

TEXT_FIELD_BYTES = 64 * 1024  # a form field other than the file (a prompt is short)
LIST_FIELDS = ("timestamp_granularities", "include")  # sent as name[] parts


@dataclass
class TranscriptionCall:
    """One checked request."""

    model: ServedModel
    audio: bytes  # the uploaded file, still encoded
    response_format: str = "json"
    stream: bool = False
    params: dict[str, Any] = field(default_factory=dict)
    words: bool = False
    id: str = field(default_factory=lambda: f"transcription-{uuid.uuid4().hex}")


# -- the form -------------------------------------------------------------------------------
async def read_form(request: web.Request, max_file_bytes: int) -> tuple[dict[str, list[str]],
                                                                         bytes | None]:
    """Text fields (repeated ones as lists) and the file's bytes, each size-checked."""
    fields: dict[str, list[str]] = {}
    if request.content_type == "application/x-www-form-urlencoded":  # a form without a file
        for name, value in (await request.post()).items():
            fields.setdefault(name, []).append(str(value))
        return fields, None
    if not request.content_type.startswith("multipart/form-data"):
        raise APIError(400, "this endpoint takes multipart/form-data with a 'file' part "
                       f"(got {request.content_type or 'no Content-Type'})")
    audio = None
    reader = await request.multipart()
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            raise APIError(400, "nested multipart bodies are not accepted")
        if part.name == "file":
            audio = await _read_part(part, max_file_bytes, "file", 413)
        elif part.name:
            value = await _read_part(part, TEXT_FIELD_BYTES, part.name, 400)
            fields.setdefault(part.name, []).append(value.decode("utf-8", "replace"))
    return fields, audio


async def _read_part(part: BodyPartReader, limit: int, name: str, status: int) -> bytes:
    chunks, size = [], 0
    while chunk := await part.read_chunk(1 << 16):
        size += len(chunk)
        if size > limit:
            raise APIError(status, f"'{name}' is larger than the limit of {limit} bytes",
                           param=name, code="request_too_large" if status == 413 else None)
        chunks.append(chunk)
    return b"".join(chunks)


def _one(fields: dict[str, list[str]], name: str) -> str | None:
    values = fields.get(name)
    return values[-1] if values else None


def _transcribes(model: ServedModel) -> bool:
    return ("audio" in model.input_modalities
            and model.omni.output_info("text").get("task") == "transcription")


def _transcriber(request: web.Request, model_id: str | None) -> ServedModel:
    models = request.app[MODELS_KEY]
    if not model_id:
        raise APIError(400, "'model' is required", param="model")
    model = models.get(model_id)
    if "audio" in model.input_modalities and model.modalities == ("text",):
        live_output_info(model, "text")  # 503 while its stage is down, rather than a wrong 400
    if not _transcribes(model):
        listening = [m.id for m in models if _transcribes(m)]
        raise APIError(400, f"model '{model.id}' does not transcribe audio; models that do: "
                       f"{', '.join(listening) or 'none'}", param="model")
    return model


def parse(model: ServedModel, fields: dict[str, list[str]], audio: bytes | None,
          translation: bool, languages: list[str]) -> TranscriptionCall:
    """The form checked: its text fields through TranscriptionForm (lax: "0.2" is 0.2,
    "true" is True), then what depends on the served model (translation, languages,
    log probabilities)."""
    if translation:
        only = " (it is English-only)" if languages == ["en"] else ""
        raise APIError(400, f"model '{model.id}' transcribes speech "
                       f"(/v1/audio/transcriptions) and does not translate{only}",
                       param="model")
    if audio is None:
        raise APIError(400, "a 'file' part with the audio is required", param="file")
    form = schema_parse(TranscriptionForm, form_body(fields, audio))
    if form.language and languages and form.language not in languages:
        raise APIError(400, f"model '{model.id}' understands {', '.join(languages)} only, "
                       f"not {form.language!r}", param="language")
    if "logprobs" in (form.include or ()):
        raise APIError(400, f"model '{model.id}' does not report log probabilities",
                       param="include")
    params: dict[str, Any] = {"temperature": form.temperature or 0.0}
    for name in ("language", "prompt"):
        if value := getattr(form, name):
            params[name] = value
    words = "word" in (form.timestamp_granularities or ())
    params["word_timestamps"] = words
    return TranscriptionCall(model, audio, form.response_format or "json", bool(form.stream),
                             params, words)


def form_body(fields: dict[str, list[str]], audio: bytes) -> dict[str, Any]:
    """The form as TranscriptionForm's input: a repeated field's last value, an empty one
    left out (as absent), the list fields ('include[]', as the openai SDK names them, or
    'include') as lists under their plain names, so an error's param is 'include[1]'."""
    body: dict[str, Any] = {name: values[-1] for name, values in fields.items()
                            if values and values[-1] != ""}
    for name in LIST_FIELDS:
        body.pop(f"{name}[]", None)
        if values := [*fields.get(f"{name}[]", ()), *fields.get(name, ())]:
            body[name] = values
    body["file"] = audio
    return body


# -- running it -----------------------------------------------------------------------------
async def _pcm(call: TranscriptionCall, rate: int, max_seconds: float) -> dict[str, Any]:
    try:
        samples = await asyncio.to_thread(decode_audio, call.audio, rate, max_seconds)
    except ValueError as exc:
        raise APIError(400, f"'file' is not usable audio: {exc}", param="file") from None
    return {"pcm_s16le": pcm16(samples), "sample_rate": rate}


async def transcribe(call: TranscriptionCall, info: dict[str, Any],
                     max_seconds: float) -> dict[str, Any]:
    audio = await _pcm(call, int(info.get("input_audio_rate", 16000)), max_seconds)
    result = None
    outputs = call.model.omni.generate({"audio": audio}, modalities=["text"],
                                       params={"*": call.params}, request_id=call.id)
    async with contextlib.aclosing(outputs):
        async for out in outputs:
            if out.modality == "text" and out.data:
                result = out.data
    if result is None:
        raise APIError(500, "the model returned no transcription", "server_error")
    return result


# -- handlers -------------------------------------------------------------------------------
async def _handle(request: web.Request, translation: bool) -> web.StreamResponse:
    settings = request.app[SETTINGS_KEY]
    fields, audio = await read_form(request, settings.max_audio_bytes)
    model = _transcriber(request, _one(fields, "model"))
    info = live_output_info(model, "text")
    call = parse(model, fields, audio, translation, list(info.get("languages") or ()))
    result = await transcribe(call, info, settings.max_audio_seconds)
    headers = {"X-Request-Id": request.headers.get("X-Request-Id") or call.id}
    if call.stream:
        response = await start_sse(request, headers["X-Request-Id"])
        for delta in stream_deltas(result):
            await response.write(sse_data({"type": "transcript.text.delta", "delta": delta}))
        await response.write(sse_data({"type": "transcript.text.done", "text": result["text"]}))
        await response.write(b"data: [DONE]\n\n")
        return response
    body, content_type = render(call.response_format, result, call.words)
    if content_type == "application/json":
        return web.json_response(body, headers=headers)
    return web.Response(text=body, content_type=content_type, charset="utf-8", headers=headers)


async def transcriptions(request: web.Request) -> web.StreamResponse:
    return await _handle(request, translation=False)


async def translations(request: web.Request) -> web.StreamResponse:
    return await _handle(request, translation=True)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/audio/transcriptions", transcriptions)
    app.router.add_post("/v1/audio/translations", translations)
