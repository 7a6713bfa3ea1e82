"""Chat completions with spoken answers (protocols.md §1): ``modalities`` with "audio".

The pipeline produces text (its "text" stages) and audio (its "audio" stages, fed by the
text as it streams: e.g. an LLM stage -> a TTS stage over a stream edge). Non-stream:
``message.audio`` = {id, data (the whole file in ``audio.format``, base64), transcript,
expires_at}, ``content`` null as OpenAI does (``"audio_transcript_in_content": true``
mirrors the text there). Stream (``pcm16`` only, as OpenAI requires): role chunk, then
``delta.audio`` pieces -- the id once, transcript pieces as text arrives, pcm16 data
pieces (24 kHz mono, each valid base64 on its own) as audio arrives -- then expires_at
once, the finish chunk, the usage chunk when asked, ``[DONE]``.

Multi-turn: an assistant message that is only ``{"audio": {"id": ...}}`` is replaced by
its transcript while the id has not expired; an unknown id is a 400.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiohttp import web

from omni.api.errors import APIError, sse_error_event
from omni.api.schemas.text import CHAT_AUDIO_FORMATS, ChatCompletionRequest
from omni.api.speech import audio_info, resolve_voice
from omni.api.state import METRICS_KEY
from omni.api.streams import first_output, next_with_pings, sse_data, start_sse
from omni.api.text import TextCall
from omni.api.text_result import TextResult, usage
from omni.media.audio import AudioEncoder
from omni.media.playback import PlaybackClock

# OpenAI's chat audio formats -> omni/media/audio.py's
FORMATS = {name: "pcm" if name == "pcm16" else name for name in CHAT_AUDIO_FORMATS}
AUDIO_TTL_S = 3600
MAX_REMEMBERED = 10000
PCM_PIECE = 6  # bytes: whole 16-bit samples and whole base64 groups
# the most pcm16 bytes in one SSE event (1 s at 24 kHz; 64 KiB of base64): audio that
# arrives in one piece (full delivery) still streams as bounded events, which line-based
# SSE readers (aiohttp's 512 KiB line limit, browsers) take
MAX_PCM_EVENT = 48_000


class Transcripts:
    """audio id -> (transcript, expires_at) of earlier answers, bounded, oldest out."""

    def __init__(self) -> None:
        self.items: OrderedDict[str, tuple[str, int]] = OrderedDict()

    def add(self, audio_id: str, transcript: str, expires_at: int) -> None:
        self.items[audio_id] = (transcript, expires_at)
        while len(self.items) > MAX_REMEMBERED:
            self.items.popitem(last=False)

    def get(self, audio_id: Any) -> str | None:
        entry = self.items.get(audio_id) if isinstance(audio_id, str) else None
        if entry is None or entry[1] < time.time():
            return None
        return entry[0]


TRANSCRIPTS_KEY = web.AppKey("transcripts", Transcripts)


def wants_audio(req: ChatCompletionRequest) -> bool:
    return "audio" in (req.modalities or ())


@dataclass
class AudioChat:
    call: TextCall
    voice: str
    format: str
    sample_rate: int
    info: dict[str, Any]
    audio_id: str = field(default_factory=lambda: f"audio_{uuid.uuid4().hex}")
    expires_at: int = field(default_factory=lambda: int(time.time()) + AUDIO_TTL_S)
    samples: int = 0
    clock: PlaybackClock = field(default_factory=PlaybackClock)

    def outputs(self) -> Any:
        pipeline = self.call.model.omni.pipeline
        params = {s: dict(self.call.sampling) for s in pipeline.outputs.get("text", ())}
        voice_stages = self.info.get("voice_stages") or pipeline.outputs["audio"]
        voice: dict[str, Any] = {"voice": self.voice}
        if "voice_stages" in self.info and "seed" in self.call.sampling:
            voice["seed"] = self.call.sampling["seed"]  # a sampling speaker: same seed, same audio
        params.update({s: dict(voice) for s in voice_stages})
        return self.call.model.omni.generate(self.call.inputs, modalities=["text", "audio"],
                                             params=params, request_id=self.call.id,
                                             input_modalities=self.call.input_modalities)

    async def encode(self, encoder: AudioEncoder, data: dict[str, Any]) -> bytes:
        if not data.get("samples"):
            return b""
        self.samples += int(data["samples"])
        self.clock.audio(int(data["samples"]) / int(data.get("sample_rate", self.sample_rate)))
        samples = data["audio"].numpy().astype(np.float32, copy=False)
        return await asyncio.to_thread(encoder.encode, samples)

    def text(self, result: TextResult, data: dict[str, Any]) -> str:
        piece = result.add(data)
        if piece:
            self.clock.text()
        return piece

    def observe(self) -> None:
        """TTFT, TTFP, RTF and underrun of this answer, on /metrics."""
        self.call.request.app[METRICS_KEY].observe_playback(self.call.model.id,
                                                            self.clock.summary())

    def usage(self, result: TextResult) -> dict[str, Any]:
        body = usage([result])
        audio_tokens = -(-self.samples // 256)  # acoustic frames, as /v1/audio/speech counts
        body["completion_tokens_details"] = {"audio_tokens": audio_tokens,
                                             "text_tokens": result.completion_tokens,
                                             "reasoning_tokens": 0}
        return body


def parse(request: web.Request, body: dict[str, Any], req: ChatCompletionRequest) -> AudioChat:
    call = TextCall(request, body, req)
    if "audio" not in call.model.modalities:
        raise APIError(400, f"model '{call.model.id}' does not speak (it outputs "
                       f"{', '.join(call.model.modalities)}); drop \"audio\" from "
                       "'modalities'", param="modalities")
    if call.n != 1:
        raise APIError(400, "'n' must be 1 with audio output", param="n")
    if req.audio is None:
        raise APIError(400, "'audio' with 'voice' and 'format' is required when "
                       "'modalities' has \"audio\"", param="audio")
    fmt = req.audio.format  # one of FORMATS (schemas/text.py)
    if req.stream and fmt != "pcm16":
        raise APIError(400, f"'audio.format' does not support '{fmt}' when stream=true. "
                       "Supported values are: 'pcm16'", param="audio.format")
    info = audio_info(call.model)
    voice = resolve_voice(call.model, body["audio"]["voice"], info)
    return AudioChat(call, voice, FORMATS[fmt], int(info.get("sample_rate", 24000)), info)


def restore_audio_turns(request: web.Request, body: dict[str, Any]) -> None:
    """Earlier spoken answers referenced by audio id become their transcripts."""
    transcripts = request.app[TRANSCRIPTS_KEY]
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    for i, message in enumerate(messages):
        if (isinstance(message, dict) and message.get("role") == "assistant"
                and message.get("content") is None and isinstance(message.get("audio"), dict)):
            transcript = transcripts.get(message["audio"].get("id"))
            if transcript is None:
                raise APIError(400, f"messages[{i}].audio.id is unknown or expired (answers "
                               f"are kept {AUDIO_TTL_S} s)", param=f"messages[{i}].audio")
            messages[i] = {"role": "assistant", "content": transcript}


async def complete(chat: AudioChat) -> web.Response:
    result, parts = TextResult(), []
    encoder = AudioEncoder(chat.format, chat.sample_rate, False)
    try:
        async with contextlib.aclosing(chat.outputs()) as outputs:
            async for out in outputs:
                if out.data and out.modality == "text":
                    chat.text(result, out.data)
                elif out.data and out.modality == "audio":
                    parts.append(await chat.encode(encoder, out.data))
        parts.append(await asyncio.to_thread(encoder.finish))
    finally:
        encoder.close()
    mirror = bool(chat.call.req.audio_transcript_in_content)
    message = {"role": "assistant", "content": result.text if mirror else None,
               "refusal": None, "annotations": [], "tool_calls": None,
               "audio": {"id": chat.audio_id, "data": base64.b64encode(b"".join(parts)).decode(),
                         "expires_at": chat.expires_at, "transcript": result.text}}
    _remember(chat, result.text)
    chat.observe()
    body = chat.call.envelope("chat.completion", [{
        "index": 0, "finish_reason": result.finish_reason, "logprobs": None,
        "message": message}])
    body["usage"] = chat.usage(result)
    return web.json_response(body, headers={"X-Request-Id": chat.call.client_request_id})


def _remember(chat: AudioChat, transcript: str) -> None:
    chat.call.request.app[TRANSCRIPTS_KEY].add(chat.audio_id, transcript, chat.expires_at)


async def stream(chat: AudioChat) -> web.StreamResponse:
    call = chat.call
    include_usage = call.req.include_usage
    outputs = chat.outputs()
    item = await first_output(outputs)
    response = await start_sse(call.request, call.client_request_id)
    encoder = AudioEncoder("pcm", chat.sample_rate, True)
    result, held, sent_id = TextResult(), b"", False

    async def send(delta: dict[str, Any], finish: str | None = None) -> None:
        payload = call.envelope("chat.completion.chunk", [
            {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}])
        if include_usage:
            payload["usage"] = None
        await response.write(sse_data(payload))

    async def send_audio(**fields: Any) -> None:
        nonlocal sent_id
        if not sent_id:
            fields = {"id": chat.audio_id, **fields}
            sent_id = True
        await send({"audio": fields})

    try:
        await send({"role": "assistant", "content": None})
        async with contextlib.aclosing(outputs):
            while item is not None:
                data = item.data or {}
                if item.modality == "text" and data:
                    piece = chat.text(result, data)
                    if piece:
                        await send_audio(transcript=piece)
                elif item.modality == "audio" and data:
                    held += await chat.encode(encoder, data)
                    cut = len(held) - len(held) % PCM_PIECE
                    for start in range(0, cut, MAX_PCM_EVENT):
                        piece = held[start:min(cut, start + MAX_PCM_EVENT)]
                        await send_audio(data=base64.b64encode(piece).decode())
                    held = held[cut:]
                item = None if item.finished else await next_with_pings(outputs, response)
        held += await asyncio.to_thread(encoder.finish)
        for start in range(0, len(held), MAX_PCM_EVENT):
            await send_audio(data=base64.b64encode(held[start:start + MAX_PCM_EVENT]).decode())
        await send_audio(expires_at=chat.expires_at)
        _remember(chat, result.text)
        chat.observe()
        await send({}, result.finish_reason)
        if include_usage:
            await response.write(sse_data({**call.envelope("chat.completion.chunk", []),
                                           "usage": chat.usage(result)}))
        await response.write(b"data: [DONE]\n\n")
    except (ConnectionResetError, ConnectionError):
        raise
    except Exception as exc:
        await response.write(sse_error_event(exc))
    finally:
        encoder.close()
    return response


async def chat_with_audio(request: web.Request, body: dict[str, Any],
                          req: ChatCompletionRequest) -> web.StreamResponse:
    chat = parse(request, body, req)
    return await (stream(chat) if req.stream else complete(chat))
