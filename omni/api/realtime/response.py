"""One realtime response: a turn of the session, streamed out as realtime events.

The conversation (items.py) becomes the session's chat history, the turn runs through
``AsyncOmni.respond`` (its AR stages keep the history's KV between turns), and its text
and audio leave as deltas: audio as pcm16 at 24 kHz, base64, each delta valid on its own.
The response holds the session's fence from its start: once a cancel or a barge-in moves
the session on, nothing more of it is sent, and ``response.done`` says ``cancelled``.

With tools (tools.py), the text is read for function calls (calls.py): each is an output
item of its own, and the message item only opens once there is something to say, so an
answer that is calls only has none. Calls are not spoken: with ``required`` or a named
function the answer is calls only (the grammar makes it so), so it runs without the
speech stages at all; with ``auto`` the text streamed to a speech stage still holds them,
and the voice leaves them out (omni/models/tool_calls.py ``spoken_text`` for a text-fed voice,
omni/models/spoken_tokens.py for a talker fed token ids).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni.api.errors import from_exception
from omni.api.realtime.calls import CallItems
from omni.api.realtime.config import SessionConfig
from omni.api.realtime.items import Item, Items, new_id
from omni.errors import RequestAbortedError
from omni.media.audio import AudioEncoder
from omni.session.conversation import conversation

Send = Callable[[dict[str, Any]], Awaitable[None]]
SendAudio = Callable[[bytes, dict[str, Any]], Awaitable[None]]
MAX_AUDIO_DELTA = 48_000  # pcm16 bytes per delta (1 s at 24 kHz): long audio is split


@dataclass
class ResponseSpec:
    """What response.create asked for, over the session's settings."""

    output_modalities: list[str]
    voice: str | None
    instructions: str
    max_output_tokens: int | str
    temperature: float | None
    tools: Any = None  # omni/api/tools.py ToolPlan; None: no tools
    reason: str | None = None  # why it stopped early: client_cancelled / turn_detected
    usage: dict[str, int] = field(default_factory=dict)


def spec_from(config: SessionConfig, raw: dict[str, Any]) -> ResponseSpec:
    """response.create's ``response`` over the session: ConfigError on a bad field."""
    from omni.api.realtime.config import ConfigError, max_tokens, temperature

    probe = SessionConfig(config.model, list(config.output_modalities), config.voice,
                          config.voices)
    session_keys = {k: raw[k] for k in ("output_modalities", "modalities", "voice",
                                        "instructions") if k in raw}
    if isinstance(raw.get("audio"), dict):
        session_keys["audio"] = {"output": raw["audio"].get("output", {})}
    probe.update(session_keys)
    limit = raw.get("max_output_tokens", raw.get("max_response_output_tokens"))
    if raw.get("conversation", "auto") != "auto" or raw.get("input") is not None:
        raise ConfigError("only responses in the session's conversation are served "
                          "(conversation: \"auto\", no input)", "response.conversation")
    return ResponseSpec(
        probe.output_modalities, probe.voice,
        raw["instructions"] if "instructions" in raw else config.instructions,
        config.max_output_tokens if limit is None else max_tokens(limit, "response.max_output_tokens"),
        config.temperature if raw.get("temperature") is None else temperature(raw["temperature"]),
        config.tools.plan)


class Response:
    """A running response; ``run`` sends every event of it, whatever happens."""

    def __init__(self, omni: Any, session_id: str, spec: ResponseSpec, send: Send,
                 audio_info: dict[str, Any], items: Items,
                 send_audio: SendAudio | None = None) -> None:
        self.omni, self.session_id, self.spec, self.send = omni, session_id, spec, send
        self.send_audio = send_audio or self._audio_deltas  # duplex: binary frames
        self.id, self.item = new_id("resp"), Item(new_id("item"), "assistant", [],
                                                  "in_progress")
        plan = spec.tools
        self.calls = CallItems(self.id, send, self._add_output) \
            if plan is not None and plan.reads_calls else None
        # a certain call (required / named) is the whole answer: nothing to speak
        self.audio = "audio" in spec.output_modalities and not (
            plan and plan.grammar and plan.mode == "required")
        self.part = {"type": "output_audio" if self.audio else "output_text",
                     **({"transcript": ""} if self.audio else {"text": ""})}
        self.audio_info, self.items = audio_info, items
        self.output: list[Item] = []  # the message and the calls, in output_index order
        self.task: asyncio.Task | None = None
        self.audio_bytes = 0  # sent so far
        self._lead = ""  # whitespace before the first words: no message for it alone

    def cancel(self, reason: str) -> None:
        self.spec.reason = self.spec.reason or reason

    def _ids(self) -> dict[str, Any]:
        return {"response_id": self.id, "item_id": self.item.id,
                "output_index": self.output.index(self.item), "content_index": 0}

    def _shell(self, status: str) -> dict[str, Any]:
        modalities = self.spec.output_modalities
        return {"id": self.id, "object": "realtime.response", "status": status,
                "output": [] if status == "in_progress" else list(self.output),
                "output_modalities": modalities,
                "modalities": ["text", "audio"] if self.audio else ["text"],
                "audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000},
                                     "voice": self.spec.voice}}}

    async def _add_output(self, item: Item) -> int:
        """A new output item, in the conversation and announced; its output_index."""
        try:
            previous = self.items.add(item)
        except ValueError:  # the conversation is full (MAX_ITEMS): said, but not kept
            previous = self.items.last_id
        self.output.append(item)
        index = len(self.output) - 1
        await self.send({"type": "response.output_item.added", "response_id": self.id,
                         "output_index": index, "item": item})
        await self.send({"type": "conversation.item.added", "previous_item_id": previous,
                         "item": item})
        return index

    async def _open_message(self) -> None:
        if self.item in self.output:
            return
        self.item.parts = [self.part]
        await self._add_output(self.item)
        await self.send({"type": "response.content_part.added", **self._ids(),
                         "part": self.part})

    async def run(self, messages: list[dict[str, Any]]) -> None:
        await self.send({"type": "response.created", "response": self._shell("in_progress")})
        if self.calls is None:  # no tools: the answer is one message, announced at once
            await self._open_message()
        status, error = "completed", None
        try:
            await self._stream(messages)
        except RequestAbortedError:
            status = "cancelled"
        except Exception as exc:  # the session stays; the client hears why
            status, error = "failed", from_exception(exc)
        if self.spec.reason is not None:
            status = "cancelled"
        await self._finish(status, error)

    async def _stream(self, messages: list[dict[str, Any]]) -> None:
        session = self.omni.sessions.manager.get(self.session_id)
        conversation(session).messages[:] = messages  # what the items say now
        encoder = None
        if self.audio:
            encoder = AudioEncoder("pcm", int(self.audio_info.get("sample_rate", 24000)), True)
        inputs: dict[str, Any] = {}
        params = self._params(inputs)
        outputs = self.omni.respond(self.session_id, modalities=self._modalities(),
                                    params=params, inputs=inputs,
                                    instructions=self.spec.instructions or None)
        async with contextlib.aclosing(outputs):
            async for out in outputs:
                if self.spec.reason is not None:
                    raise RequestAbortedError(self.spec.reason)
                if out.finished or not out.data:
                    continue
                if out.modality == "text":
                    await self._text(out.data)
                elif out.modality == "audio" and encoder is not None:
                    await self._audio(encoder, out.data)
        if encoder is not None:
            await self._pcm_out(encoder.finish())

    def _modalities(self) -> list[str]:
        return ["text", "audio"] if self.audio else ["text"]

    def _params(self, inputs: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Each stage's params; the tools go into ``inputs`` (the prompt's tool list)."""
        pipeline = self.omni.pipeline
        text: dict[str, Any] = {}
        if self.spec.max_output_tokens != "inf":
            text["max_tokens"] = self.spec.max_output_tokens
        if self.spec.temperature is not None:
            text["temperature"] = self.spec.temperature
        if self.spec.tools is not None:
            self.spec.tools.apply(inputs, text)  # and the call grammar, if any
        params = {s: dict(text) for s in pipeline.outputs.get("text", ())}
        if self.audio and self.spec.voice:
            stages = self.audio_info.get("voice_stages") or pipeline.outputs.get("audio", ())
            params.update({s: {"voice": self._engine_voice()} for s in stages})
        return params

    def _engine_voice(self) -> str | None:
        """The model's own voice id: OpenAI's names map to its alias where it has one."""
        ids = [v["id"] for v in self.audio_info.get("voices") or ()]
        alias = self.audio_info.get("openai_voice_alias")
        return alias if self.spec.voice not in ids and alias else self.spec.voice

    async def _text(self, data: dict[str, Any]) -> None:
        usage = self.spec.usage
        for key in ("prompt_tokens", "cached_tokens", "completion_tokens"):
            if key in data:
                usage[key] = int(data[key])
        # a cancelled answer never gets its completion_tokens: count what came
        usage["streamed_tokens"] = usage.get("streamed_tokens", 0) + len(data.get("token_ids")
                                                                         or ())
        piece = data.get("text") or ""
        if piece:
            await self._content(piece if self.calls is None else await self.calls.feed(piece))

    async def _content(self, piece: str) -> None:
        """Words of the message (the text, calls read out of it)."""
        if self.item not in self.output:
            if not piece.strip():
                self._lead += piece
                return
            piece, self._lead = self._lead + piece, ""
            await self._open_message()
        key = "transcript" if self.audio else "text"
        self.part[key] += piece
        kind = "response.output_audio_transcript.delta" if self.audio \
            else "response.output_text.delta"
        await self.send({"type": kind, **self._ids(), "delta": piece})

    async def _audio(self, encoder: AudioEncoder, data: dict[str, Any]) -> None:
        if not data.get("samples"):
            return
        samples = data["audio"].numpy().astype(np.float32, copy=False)
        self.spec.usage["audio_samples"] = self.spec.usage.get("audio_samples", 0) + samples.size
        await self._pcm_out(await asyncio.to_thread(encoder.encode, samples))

    async def _pcm_out(self, pcm: bytes) -> None:
        if pcm and self.spec.reason is None:  # nothing more once cancelled or interrupted
            await self._open_message()
            await self.send_audio(pcm, self._ids())
            self.audio_bytes += len(pcm)
            self.item.audio_ms = self.audio_bytes // 48  # pcm16 at 24 kHz

    async def _audio_deltas(self, pcm: bytes, ids: dict[str, Any]) -> None:
        for start in range(0, len(pcm), MAX_AUDIO_DELTA):
            delta = base64.b64encode(pcm[start:start + MAX_AUDIO_DELTA]).decode()
            await self.send({"type": "response.output_audio.delta", **ids, "delta": delta})

    async def _finish(self, status: str, error: Any) -> None:
        if self.calls is not None:
            held = await self.calls.finish(status)
            if status == "completed":  # no more words once cancelled
                await self._content(held)
        if not self.output:  # nothing said, no call made: an empty message, as without tools
            await self._open_message()
        if self.item in self.output:
            await self._finish_message(status)
        body = self._shell(status)
        body["usage"] = self._usage()
        if status == "cancelled":
            body["status_details"] = {"type": "cancelled",
                                      "reason": self.spec.reason or "client_cancelled"}
        elif error is not None:
            body["status_details"] = {"type": "failed", "error": {
                "type": error.type, "code": error.code, "message": error.message}}
        await self.send({"type": "response.done", "response": body})

    async def _finish_message(self, status: str) -> None:
        self.item.status = "completed" if status == "completed" else "incomplete"
        ids = self._ids()
        if self.audio:
            await self.send({"type": "response.output_audio.done", **ids})
            await self.send({"type": "response.output_audio_transcript.done", **ids,
                             "transcript": self.part["transcript"]})
        else:
            await self.send({"type": "response.output_text.done", **ids,
                             "text": self.part["text"]})
        await self.send({"type": "response.content_part.done", **ids, "part": self.part})
        await self.send({"type": "response.output_item.done", "response_id": self.id,
                         "output_index": ids["output_index"], "item": self.item})
        await self.send({"type": "conversation.item.done", "item": self.item})

    def _usage(self) -> dict[str, Any]:
        u = self.spec.usage
        text_out = u.get("completion_tokens", u.get("streamed_tokens", 0))
        audio_out = -(-u.get("audio_samples", 0) // 256)  # acoustic frames, as chat counts
        prompt = u.get("prompt_tokens", 0)
        return {"total_tokens": prompt + text_out + audio_out, "input_tokens": prompt,
                "output_tokens": text_out + audio_out,
                "input_token_details": {"text_tokens": prompt, "audio_tokens": 0,
                                        "image_tokens": 0,
                                        "cached_tokens": u.get("cached_tokens", 0)},
                "output_token_details": {"text_tokens": text_out, "audio_tokens": audio_out}}
