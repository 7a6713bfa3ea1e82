"""Server-VAD turns of a realtime session (VadTurns, held by connection.py's
RealtimeConnection).

The VAD stage's events drive the turn: speech_started opens it (and interrupts an answer
being given: barge-in), speech_stopped commits the audio and, with create_response,
starts the answer. speech_paused (the silence begins) starts the turn's transcription at
once, while the silence window runs; speech_resumed (the speaker went on) drops it. So
when the turn ends its transcript is ready or nearly: the recognizer's time overlaps the
window instead of following it (bench/results/sessions.md, part voice).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import omni.api.realtime.audio_input as audio_input
from omni.api.realtime.config import ClientError, ConfigError, SessionConfig
from omni.api.realtime.items import new_id
from omni.api.realtime.response import Response
from omni.errors import OmniError
from omni.session import SessionError

EARLY_TAIL_MS = 200  # audio kept past the start of a pause for an early transcript


class TurnHost(Protocol):
    """What the VAD turns need of their connection (connection.py): its settings and the
    answer being given, its events out, and what ends a turn (commit, then answer)."""

    config: SessionConfig
    response: Response | None

    async def send(self, event: dict[str, Any]) -> None: ...
    async def error(self, message: str, code: str | None) -> None: ...
    async def audio_commit(self, event: dict[str, Any], from_ms: int | None = None,
                           early: tuple[asyncio.Task, bytes] | None = None) -> None: ...
    async def response_create(self, event: dict[str, Any]) -> None: ...
    def _cancel_response(self, reason: str) -> None: ...


class VadTurns:
    """The turn the VAD is hearing: its item id, where its speech started, and the
    transcript started early in its silence window."""

    def __init__(self, connection: TurnHost, audio: audio_input.InputAudio, listener: Any,
                 spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task]) -> None:
        self.connection = connection
        self.audio = audio  # the session's input audio, which the early transcript reads
        self.listener = listener  # the transcriber (None: the model takes no audio)
        self.spawn = spawn  # a task the connection owns (and cancels when it closes)
        self.speech_item: str | None = None  # the item the speech heard now will become
        self.speech_from = 0  # where that speech started, on the session's audio clock
        # (paused at, its transcript, its audio)
        self.early: tuple[int, asyncio.Task, bytes] | None = None

    def take_item(self) -> str | None:
        """The item id of the speech heard now, for the audio being committed: the next
        speech gets a new one."""
        item, self.speech_item = self.speech_item, None
        return item

    async def on_event(self, event: dict[str, Any]) -> None:
        """One event of the VAD stage (audio_input.ServerVad calls this)."""
        try:
            await self._on_speech(event)
        except (ClientError, ConfigError, SessionError, OmniError) as exc:
            await self.connection.error(str(exc),
                                        getattr(exc, "code", None) or "vad_turn_failed")

    async def _on_speech(self, event: dict[str, Any]) -> None:
        connection = self.connection
        settings = connection.config.turn_detection or {}
        if event.get("type") == "speech_started":
            self.speech_item = new_id("item")
            self.speech_from = int(event["audio_ms"])
            if connection.response is not None and settings.get("interrupt_response", True):
                # barge-in, before the event: no audio of the answer follows it
                connection._cancel_response("turn_detected")
            await connection.send({"type": "input_audio_buffer.speech_started",
                                   "audio_start_ms": self.speech_from,
                                   "item_id": self.speech_item})
        elif event.get("type") == "speech_paused" and self.speech_item is not None \
                and self.listener is not None:
            self._drop_early()
            self.early = self._early_transcript(int(event["audio_ms"]))
        elif event.get("type") == "speech_resumed":
            self._drop_early()  # the speaker went on: that transcript is of half a turn
        elif event.get("type") == "speech_stopped" and self.speech_item is not None:
            await connection.send({"type": "input_audio_buffer.speech_stopped",
                                   "audio_end_ms": int(event["audio_ms"]),
                                   "item_id": self.speech_item})
            early = self.early if self.early and self.early[0] == event["audio_ms"] else None
            if early is None:
                self._drop_early()
            self.early = None
            await connection.audio_commit({}, self.speech_from, early[1:] if early else None)
            if settings.get("create_response", True):
                await connection.response_create({})

    def _early_transcript(self, paused_ms: int) -> tuple[int, asyncio.Task, bytes]:
        """Transcribe the turn as it stands when its silence begins, while the silence
        window runs (the transcript the turn needs is then ready, or nearly, when it
        ends); EARLY_TAIL_MS past the pause keeps the last sound whole."""
        pcm = self.audio.peek(self.speech_from, paused_ms + EARLY_TAIL_MS)
        task = self.spawn(audio_input.transcribe(self.listener, pcm,
                                                 f"asr-{self.speech_item}-{paused_ms}",
                                                 self.connection.config.transcription))
        return paused_ms, task, pcm

    def _drop_early(self) -> None:
        if self.early is not None:
            self.early[1].cancel()  # its request is aborted where it runs
            self.early = None

