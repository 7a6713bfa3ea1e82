"""GET /v1/realtime: the OpenAI realtime API over a WebSocket (protocols.md §5).

One connection is one attached session (omni/session/): ``session.created`` comes first
and carries ``resume_token``; a client that reconnects within the pipeline's
``sessions.resume_grace_s`` with ``?resume_token=...`` gets the same session back (its
settings, its conversation, its engines' KV). A connection beyond the pipeline's
``sessions.max_sessions`` is closed with 1013 (try again later) after one ``error`` event.

Client events are JSON (text frames; binary frames are read as JSON too). A malformed or
unknown event gets an ``error`` event naming the ``event_id`` that caused it and the
socket stays open; a client that keeps sending bad events (MAX_BAD_EVENTS) is closed with
1008; a frame over the size limit with 1009 (aiohttp's reader). When the session ends
under the connection (its replica died, its lease ran out) the client gets an ``error``
event and a 1011 close, never a hang. The server VAD's replica dying is one ``error``
event; the session stays and the VAD listens again (audio_input.ServerVad). A stopping
server lets the response in flight finish, then closes with 1001 and ends the session
(omni/api/sockets.py).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

import omni.api.realtime.audio_input as audio_input
from omni.api.errors import from_exception
from omni.api.realtime.config import VAD_DEFAULTS, ClientError, ConfigError, SessionConfig
from omni.api.realtime.item_events import ItemEvents
from omni.api.realtime.items import BETA_NAMES, EventIds, Item, Items, new_id
from omni.api.realtime.response import Response, spec_from
from omni.api.realtime.tools import has_tools, read_tools
from omni.api.realtime.turns import VadTurns
from omni.api.sockets import SocketWork
from omni.errors import OmniError
from omni.media.fetch import FetchPolicy
from omni.session import Session, SessionError

log = logging.getLogger("omni.api.realtime")
MAX_BAD_EVENTS = 50  # a client this wrong is not going to recover: 1008


class RealtimeConnection(ItemEvents):
    """One client on one session (see module doc); conversation.item.* events are
    item_events.py's."""
    kind = "realtime"  # its key in the session's state (a transcription session's: its own)

    def __init__(self, ws: web.WebSocketResponse, model: Any, session: Session, beta: bool,
                 max_audio_seconds: float, media_policy: FetchPolicy | None = None) -> None:
        self.ws, self.model, self.omni, self.session, self.beta = (ws, model, model.omni,
                                                                   session, beta)
        self.media_policy = media_policy or FetchPolicy()
        self.ids = EventIds()
        state = session.state.setdefault(self.kind, {})
        self.config: SessionConfig = state.get("config") or self._default_config()
        self.items: Items = state.setdefault("items", Items())
        state["config"] = self.config
        self.audio = audio_input.InputAudio(max_audio_seconds)
        self.listener = audio_input.transcriber(self.omni)
        self.response: Response | None = None
        self.vad: audio_input.ServerVad | None = None
        self.bad_events = 0
        self.tasks: set[asyncio.Task] = set()
        self.turns = VadTurns(self, self.audio, self.listener, self._spawn)  # turns.py
        self._send_lock = asyncio.Lock()
        self.work = SocketWork(ws)  # a drain lets the response in flight finish

    @property
    def handlers(self) -> dict[str, str]:
        return HANDLERS  # a transcription session takes fewer events (transcription.py)

    def _default_config(self) -> SessionConfig:
        info = self.omni.output_info("audio") if "audio" in self.model.modalities else {}
        voices = tuple(v["id"] for v in info.get("voices") or ())
        if info.get("openai_voice_alias"):
            from omni.models.speech import OPENAI_VOICES
            voices += tuple(sorted(OPENAI_VOICES))
        vad = audio_input.has_vad(self.omni)
        return SessionConfig(self.model.id, ["audio"] if voices else ["text"],
                             voices[0] if voices else None, voices,
                             turn_detection=dict(VAD_DEFAULTS) if vad else None)

    # -- sending -----------------------------------------------------------------------
    async def send(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if self.beta and kind in BETA_NAMES:
            if BETA_NAMES[kind] is None:
                return
            event = {**event, "type": BETA_NAMES[kind]}
        body = json.dumps({"event_id": self.ids.next(), **event}, default=self._render)
        async with self._send_lock:
            if not self.ws.closed:
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await self.ws.send_str(body)

    def _render(self, value: Any) -> Any:
        if isinstance(value, Item):
            return value.render(self.beta)
        raise TypeError(f"cannot send {type(value).__name__}")

    async def error(self, message: str, code: str | None, param: str | None = None,
                    event_id: str | None = None, type_: str = "invalid_request_error") -> None:
        await self.send({"type": "error", "error": {"type": type_, "code": code,
                                                    "message": message, "param": param,
                                                    "event_id": event_id}})

    # -- the loop ----------------------------------------------------------------------
    async def run(self) -> None:
        self.session.on_end.append(self._session_ended)
        await self.send({"type": "session.created", "resume_token": self.session.resume_token,
                         "session": self.config.render(self.session.id, self.beta)})
        await self._listen()
        async for message in self.ws:
            if message.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                break
            await self._receive(message.data)
            if self.bad_events > MAX_BAD_EVENTS:
                await self.ws.close(code=WSCloseCode.POLICY_VIOLATION,
                                    message=b"too many invalid events")
                break

    async def _receive(self, raw: str | bytes) -> None:
        event_id = None
        try:
            event = parse_event(raw)
            event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
            name = self.handlers.get(event["type"])
            if name is None:
                raise ClientError(f"unknown event type {event['type']!r}", "unknown_event",
                                  "type")
            self.session = self.omni.sessions.manager.append(self.session.id)
            await getattr(self, name)(event)
        except ClientError as exc:
            self.bad_events += 1
            await self.error(str(exc), exc.code, exc.param, event_id)
        except ConfigError as exc:
            self.bad_events += 1
            await self.error(str(exc), "invalid_value", exc.param, event_id)
        except (SessionError, OmniError) as exc:
            await self.error(str(exc), "session_error", None, event_id, "server_error")

    async def close(self) -> None:
        """The client left (or the session ended, or the server closed the socket on
        shutdown): stop its work. A normal close (1000) or the server's shutdown ends the
        session; any other way out (the client's 1001 going away, a dropped connection)
        keeps it detached for a resume, until the grace period closes it."""
        if self.response is not None:
            self._cancel_response("client_disconnected")
        if self.vad is not None:
            await self.vad.close()
        for task in list(self.tasks):
            task.cancel()
        with contextlib.suppress(ValueError):
            self.session.on_end.remove(self._session_ended)
        if self.work.going_away:
            self.omni.close_session(self.session.id, "the server shut down")
        elif self.ws.close_code == WSCloseCode.OK:
            self.omni.close_session(self.session.id, "the client closed the connection")
        else:
            self.omni.sessions.manager.detach(self.session.id)

    def _session_ended(self, session: Session, reason: str) -> None:
        async def tell() -> None:
            await self.error(f"the session ended: {reason}", "session_ended",
                             type_="server_error")
            await self.ws.close(code=WSCloseCode.INTERNAL_ERROR, message=b"session ended")
        self._spawn(tell())

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    # -- session -----------------------------------------------------------------------
    async def session_update(self, event: dict[str, Any]) -> None:
        before = self.config.turn_detection
        session = event.get("session")
        if isinstance(session, dict) and session.get("type") not in (None, self.config.kind):
            raise ConfigError(f"this is a {self.config.kind} session; a transcription session "
                              "is its own connection (/v1/realtime?intent=transcription)",
                              "session.type")
        tools = None
        if self.config.kind == "realtime" and has_tools(session):  # checked before changes
            tools = await read_tools(self.model, session, self.config.tools, "session")
        self.config.update(session)
        self.config.tools = tools or self.config.tools
        if self.config.turn_detection is not None and not audio_input.has_vad(self.omni):
            self.config.turn_detection = before
            raise ConfigError(f"model '{self.model.id}' has no voice activity detector; use "
                              "turn_detection null and commit the audio yourself",
                              "session.turn_detection")
        await self.send({"type": "session.updated",
                         "session": self.config.render(self.session.id, self.beta)})
        if self.config.turn_detection != before:
            await self._listen()

    async def _listen(self) -> None:
        """(Re)start the server VAD after a change of turn detection."""
        if self.vad is not None:
            await self.vad.close()
            self.vad = None
        if self.config.turn_detection is not None:
            self.vad = audio_input.ServerVad(self.omni, self.config.turn_detection,
                                             self.turns.on_event, self._vad_failed)
            self.vad.start(self.audio.now_ms)

    async def _vad_failed(self, exc: Exception) -> None:
        """The server VAD's request failed (its replica died): one error event; the
        session stays, and the VAD listens again once its stage serves (ServerVad)."""
        error = from_exception(exc)
        await self.error(f"turn detection stopped: {error.message}. It resumes by itself "
                         "once the stage serves again; meanwhile audio can be committed with "
                         "input_audio_buffer.commit", error.code or "turn_detection_failed",
                         type_="server_error")

    # -- input audio -------------------------------------------------------------------
    async def audio_append(self, event: dict[str, Any]) -> None:
        try:
            pcm = base64.b64decode(event.get("audio") or "", validate=True)
        except (binascii.Error, ValueError, TypeError) as exc:
            raise ClientError(f"'audio' must be base64 pcm16 at 24 kHz: {exc}",
                              "invalid_audio", "audio") from None
        self.append_pcm(pcm)

    def append_pcm(self, pcm: bytes) -> None:
        """24 kHz pcm16 into the buffer (and the VAD, when it listens)."""
        start_ms = self.audio.now_ms
        try:
            pcm16k = self.audio.append(pcm)
        except ValueError as exc:
            raise ClientError(f"input audio: {exc}", "invalid_audio", "audio") from None
        if self.vad is not None:
            self.vad.feed(pcm16k, start_ms)

    async def audio_commit(self, event: dict[str, Any], from_ms: int | None = None,
                           early: tuple[asyncio.Task, bytes] | None = None) -> None:
        if not self.audio.buffer:
            raise ClientError("the input audio buffer is empty", "input_audio_buffer_commit_empty")
        if self.listener is None:
            raise ClientError(f"model '{self.model.id}' does not take audio input",
                              "unsupported_input")
        item_id = self.turns.take_item() or new_id("item")
        item = Item(item_id, "user", [{"type": "input_audio", "transcript": None}])
        previous = self.items.add(item)
        await self.send({"type": "input_audio_buffer.committed", "item_id": item_id,
                         "previous_item_id": previous})
        await self._item_added(item, previous)
        pcm = self.audio.take(from_ms)
        self._transcribe(item, early[1] if early else pcm, early[0] if early else None)

    async def audio_clear(self, event: dict[str, Any]) -> None:
        self.audio.clear()
        await self.send({"type": "input_audio_buffer.cleared"})

    def _transcribe(self, item: Item, pcm16k: bytes,
                    started: asyncio.Task | None = None) -> None:
        """The item's transcript, from ``started`` (a transcription begun during the
        silence window) or a new one."""
        task = started or self._spawn(audio_input.transcribe(
            self.listener, pcm16k, f"asr-{item.id}", self.config.transcription))

        # the audio part (an item may hold images before it)
        index = next(i for i, p in enumerate(item.parts) if p["type"] == "input_audio")

        async def run() -> None:
            try:
                result = await task
            except Exception as exc:
                await self.send({"type": "conversation.item.input_audio_transcription.failed",
                                 "item_id": item.id, "content_index": index, "error": {
                                     "type": "server_error", "message": str(exc)}})
                return
            item.parts[index]["transcript"] = transcript = (result.get("text") or "").strip()
            for delta in audio_input.transcript_deltas(result):
                await self.send({"type": "conversation.item.input_audio_transcription.delta",
                                 "item_id": item.id, "content_index": index, "delta": delta})
            await self.send({"type": "conversation.item.input_audio_transcription.completed",
                             "item_id": item.id, "content_index": index, "transcript": transcript,
                             "usage": {"type": "duration",
                                       "seconds": round(len(pcm16k) / 32000, 3)}})
        item.transcribing = self._spawn(run())

    # -- responses ---------------------------------------------------------------------
    def _no_active_response(self) -> None:
        if self.response is not None:
            raise ClientError("a response is already in progress; cancel it first",
                              "conversation_already_has_active_response")

    async def response_create(self, event: dict[str, Any]) -> None:
        previous = self.response
        if previous is not None and previous.spec.reason is not None and previous.task:
            await previous.task  # cancelled or interrupted: its last events go first
        self._no_active_response()
        raw = event.get("response") or {}
        if not isinstance(raw, dict):
            raise ClientError("'response' must be an object", "invalid_value", "response")
        spec = spec_from(self.config, raw)
        if has_tools(raw):  # this response's own tools
            spec.tools = (await read_tools(self.model, raw, self.config.tools, "response")).plan
            # checking them yields (a thread): server VAD may have started one meanwhile
            self._no_active_response()
        info = self.omni.output_info("audio") if "audio" in spec.output_modalities else {}
        response = Response(self.omni, self.session.id, spec, self.send, info,
                            self.items, self.audio_out)
        self.response = response

        async def run() -> None:
            try:
                await response.run(await self.items.messages())
            finally:
                if self.response is response:
                    self.response = None
        response.task = self._spawn(run())
        self.work.begin()  # until its response.done is sent (or it is cancelled unstarted)
        response.task.add_done_callback(lambda _: self.work.end())

    async def response_cancel(self, event: dict[str, Any]) -> None:
        if self.response is None or (event.get("response_id") not in (None, self.response.id)):
            raise ClientError("no response to cancel", "response_cancel_not_active")
        self._cancel_response("client_cancelled")

    def _cancel_response(self, reason: str) -> None:
        response = self.response
        if response is None:
            return
        response.cancel(reason)
        with contextlib.suppress(SessionError):
            self.omni.signal(self.session.id, "interrupt" if reason == "turn_detected"
                             else "cancel")

    audio_out = None  # a response's audio: base64 deltas (duplex.py sends binary frames)

    async def ignore(self, event: dict[str, Any]) -> None:
        """Events meant for WebRTC (output_audio_buffer.clear): nothing to do over WS."""


def parse_event(raw: str | bytes) -> dict[str, Any]:
    """One client frame -> its event (a JSON object with a string ``type``); ClientError
    otherwise. RecursionError too: json.loads of a deeply nested frame raises it."""
    try:
        event = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ClientError(f"the event is not valid JSON: {str(exc)[:200]}",
                          "invalid_json") from None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise ClientError("an event is a JSON object with a string 'type'")
    return event


# event type -> the name of the connection's method that handles it, looked up on the
# connection itself at each event, so a subclass's override (duplex.py) is what runs
HANDLERS = {
    "session.update": "session_update",
    "input_audio_buffer.append": "audio_append",
    "input_audio_buffer.commit": "audio_commit",
    "input_audio_buffer.clear": "audio_clear",
    "conversation.item.create": "item_create",
    "conversation.item.delete": "item_delete",
    "conversation.item.retrieve": "item_retrieve",
    "conversation.item.truncate": "item_truncate",
    "response.create": "response_create",
    "response.cancel": "response_cancel",
    "output_audio_buffer.clear": "ignore",
}
