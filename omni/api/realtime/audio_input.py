"""A realtime session's input audio: the buffer, its transcription, server VAD.

The client appends pcm16 at 24 kHz (base64); it is resampled once to 16 kHz (what the
recognizer and the VAD take) and kept in the input buffer. A commit turns the buffer
into a user item whose transcript comes from the model's transcription stage (a view of
the same pipeline whose text stage reports ``task: transcription``), run as its own
request.

Server VAD (``turn_detection: server_vad``) is an engine stage too (the pipeline's
``voice_activity`` output): while the session listens, one
request of it stays open and every appended chunk is fed to it (``AsyncOmni.feed``); its
speech_started / speech_stopped events come back as outputs, in milliseconds of the
session's input audio. The orchestrator forwards those messages and never reads audio.
When that request fails under the session (its replica died), the client gets one
``error`` event and the VAD listens again once its stage serves (ServerVad).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from omni.api.subtitles import stream_deltas
from omni.errors import OmniError
from omni.media.audio import PcmResampler

log = logging.getLogger("omni.api.realtime")

INPUT_RATE = 16_000  # what the recognizer and the VAD take
BYTES_PER_MS = INPUT_RATE * 2 // 1000


class InputAudio:
    """The input buffer: 16 kHz pcm16 since the last commit or clear, and where it starts
    in the session's audio clock (ms since the first append)."""

    def __init__(self, max_seconds: float, in_rate: int = 24_000) -> None:
        self.resampler = PcmResampler(in_rate, INPUT_RATE)
        self.max_bytes = int(max_seconds * INPUT_RATE) * 2
        self.buffer = bytearray()
        self.start_ms = 0  # the buffer's first sample on the session's audio clock
        self.total_bytes = 0  # every 16 kHz byte appended so far

    def append(self, pcm24: bytes) -> bytes:
        """The 16 kHz pcm of this chunk, now in the buffer; ValueError when it is not
        16-bit audio or the buffer would pass its limit."""
        pcm = self.resampler.feed(pcm24)
        if len(self.buffer) + len(pcm) > self.max_bytes:
            raise ValueError(f"the input audio buffer holds at most "
                             f"{self.max_bytes // (2 * INPUT_RATE)} s; commit or clear it")
        self.buffer += pcm
        self.total_bytes += len(pcm)
        return pcm

    @property
    def now_ms(self) -> int:
        return self.total_bytes // BYTES_PER_MS

    def peek(self, from_ms: int, to_ms: int) -> bytes:
        """The buffer's audio between two points of the session clock, left in place."""
        first = max(0, (from_ms - self.start_ms) * BYTES_PER_MS)
        return bytes(self.buffer[first:max(first, (to_ms - self.start_ms) * BYTES_PER_MS)])

    def take(self, from_ms: int | None = None) -> bytes:
        """The buffer's audio (from ``from_ms`` on the session clock, if later than its
        start), emptied."""
        skip = 0 if from_ms is None else max(0, (from_ms - self.start_ms) * BYTES_PER_MS)
        audio = bytes(self.buffer[skip:])
        self.clear()
        return audio

    def clear(self) -> None:
        self.buffer.clear()
        self.start_ms = self.now_ms


def transcriber(omni: Any) -> Any | None:
    """What transcribes speech on this model's engines: a view whose only output is text
    from a stage that reports ``task: transcription``, or None (no audio input)."""
    root = getattr(omni, "parent", omni)
    candidates = [(None, root.pipeline)] + list(root.pipeline.views.items())
    for name, pipeline in candidates:
        if pipeline.modalities == ("text",) and "audio" in pipeline.input_modalities \
                and root.output_info("text", pipeline).get("task") == "transcription":
            return root if name is None else root.view(name)
    return None


async def transcribe(listener: Any, pcm16k: bytes, request_id: str,
                     settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The transcription stage's result for 16 kHz pcm16 ({"text", "duration", ...});
    the session's ``transcription`` settings give its language and prompt."""
    result: dict[str, Any] = {}
    params = {key: value for key, value in (settings or {}).items()
              if key in ("language", "prompt") and isinstance(value, str) and value}
    outputs = listener.generate({"audio": {"pcm_s16le": pcm16k, "sample_rate": INPUT_RATE}},
                                modalities=["text"], request_id=request_id,
                                params={"*": params} if params else None)
    async with contextlib.aclosing(outputs):
        async for out in outputs:
            if out.modality == "text" and out.data:
                result = out.data
    return result


def transcript_deltas(result: dict[str, Any]) -> list[str]:
    """The stripped transcript in pieces, one per segment: the recognizer answers whole,
    so these come together, as /v1/audio/transcriptions streams them."""
    text = (result.get("text") or "").strip()
    if not text:
        return []
    if not result.get("segments"):
        return [text]
    pieces = stream_deltas({**result, "text": (result.get("text") or "").rstrip()})
    pieces[0] = pieces[0].lstrip()
    pieces = [p for p in pieces if p]
    return pieces if "".join(pieces) == text else [text]


def has_vad(omni: Any) -> bool:
    return "voice_activity" in getattr(omni, "parent", omni).pipeline.modalities


class ServerVad:
    """One open VAD request of the session's input audio; events go to ``on_event``.

    The request can end under the session: its replica died (its in-flight requests fail
    with a typed error), its stage is down. Then ``on_failure`` hears why, once per
    outage; audio is not fed meanwhile (it stays in the input buffer, which the client
    can still commit), and the next audio at least RETRY_S later opens a new request, so
    turns are detected again as soon as the stage serves (a restarted replica). A feed
    never raises for a request that ended: that is the failure already reported, and
    a burst of errors per audio chunk would tell the client nothing more."""

    LIFETIME_S = 24 * 3600.0  # the request lives as long as the connection listens
    RETRY_S = 1.0  # a request that failed is opened again no sooner than this

    def __init__(self, omni: Any, settings: dict[str, Any],
                 on_event: Callable[[dict[str, Any]], Awaitable[None]],
                 on_failure: Callable[[Exception], Awaitable[None]]) -> None:
        self.omni = getattr(omni, "parent", omni)
        self.settings, self.on_event, self.on_failure = settings, on_event, on_failure
        self.stream: Any = None
        self.task: asyncio.Task | None = None
        self.offset_ms = 0  # the session clock when this VAD stream started
        self.failed_at: float | None = None  # when the stream ended under us; None: fine

    def start(self, offset_ms: int) -> None:
        """Open the request (admitted at once, so it can be fed) and read its events."""
        params = {k: self.settings[k] for k in ("threshold", "prefix_padding_ms",
                                                "silence_duration_ms")}
        params["pauses"] = True  # speech_paused: transcribe during the silence window
        self.offset_ms = offset_ms
        self.stream = self.omni.open_stream(
            {}, modalities=["voice_activity"], input_modalities=["audio"],
            params={"*": params}, request_id=f"vad-{uuid.uuid4().hex}",
            timeout_s=self.LIFETIME_S)
        self.task = asyncio.ensure_future(self._read(self.stream))

    def feed(self, pcm16k: bytes, at_ms: int) -> None:
        """A chunk of input audio that starts at ``at_ms`` on the session clock."""
        if self.failed_at is not None and not self._reopen(at_ms):
            return
        if self.stream is None or self.stream.finished:  # it just ended: its reader
            return  # reports why, once (None: it could not open; that was said then)
        try:
            self.stream.feed({"audio": pcm16k, "sample_rate": INPUT_RATE})
        except OmniError:  # it ended meanwhile: the same
            return

    def _reopen(self, at_ms: int) -> bool:
        """A new request after a failure, at most every RETRY_S; True if it is open (a
        stage without a live replica fails it at once: tried again later)."""
        if time.monotonic() - self.failed_at < self.RETRY_S:
            return False
        self.failed_at = time.monotonic()
        try:
            self.start(at_ms)
        except OmniError:  # not admitted now (the pipeline is full, shutting down)
            return False
        if self.stream.finished:
            return False
        log.info("server VAD listening again (request %s)", self.stream.request_id)
        self.failed_at = None
        return True

    async def _read(self, stream: Any) -> None:
        try:
            async for out in stream.outputs:
                for event in (out.data or {}).get("events", ()):
                    await self.on_event({**event,
                                         "audio_ms": event["audio_ms"] + self.offset_ms})
        except Exception as exc:  # noqa: BLE001 - the request failed: the session hears it
            await self._failed(stream, exc)

    async def _failed(self, stream: Any, exc: Exception) -> None:
        first = self.failed_at is None
        self.failed_at = time.monotonic()
        with contextlib.suppress(Exception):
            await stream.aclose()
        if first and stream is self.stream:  # a retry that failed at once stays quiet
            await self.on_failure(exc)

    async def close(self) -> None:
        if self.task is None:
            return
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task
        await self.stream.aclose()
