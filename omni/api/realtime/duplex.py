"""GET /v1/duplex: full-duplex voice on the realtime session layer (docs/duplex.md).

The client streams its microphone in while the server streams the answer out, both as
binary frames of pcm16 at 24 kHz mono (no base64, no JSON per chunk); every other event
is a realtime event in a text frame, GA names. The server always listens (server VAD,
never null): speech ends a turn and starts a response; speech during a response is a
barge-in: the session's fence moves on (``interrupt``), so no audio of the old answer
leaves after ``input_audio_buffer.speech_started``, its ``response.done`` says
``cancelled`` / ``turn_detected``, what it had said stays in the conversation, and the next
response starts from what the user said.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from omni.api.errors import APIError
from omni.api.realtime import audio_input, realtime_model, upgrade
from omni.api.realtime.config import VAD_DEFAULTS, ClientError, ConfigError, SessionConfig
from omni.api.realtime.connection import RealtimeConnection


class DuplexConnection(RealtimeConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.beta = False  # duplex speaks GA names only

    def _default_config(self) -> SessionConfig:
        config = super()._default_config()
        config.turn_detection = dict(VAD_DEFAULTS)
        return config

    async def _receive(self, raw: str | bytes) -> None:
        if isinstance(raw, str):
            await super()._receive(raw)
            return
        try:
            self.append_pcm(raw)
        except ClientError as exc:
            self.bad_events += 1
            await self.error(str(exc), exc.code, exc.param)

    async def session_update(self, event: dict[str, Any]) -> None:
        """As the realtime one, but turn_detection null (beta's flat key or GA's
        audio.input one) is refused: a duplex session always listens."""
        session = event.get("session")
        audio = session.get("audio") if isinstance(session, dict) else None
        audio_in = audio.get("input") if isinstance(audio, dict) else None
        if any(isinstance(where, dict) and "turn_detection" in where
               and where["turn_detection"] is None for where in (session, audio_in)):
            raise ConfigError("a duplex session always listens: turn_detection is "
                              "server_vad (use /v1/realtime to commit turns yourself)",
                              "session.turn_detection")
        await super().session_update(event)

    async def audio_out(self, pcm: bytes, ids: dict[str, Any]) -> None:
        """A binary frame of the running answer; checked under the send lock, so once a
        barge-in's speech_started is on the wire, no frame of the old answer follows."""
        async with self._send_lock:
            live = self.response is not None and self.response.id == ids["response_id"] \
                and self.response.spec.reason is None
            if live and not self.ws.closed:
                await self.ws.send_bytes(pcm)


def check_duplex_model(model: Any) -> None:
    """400 before the upgrade unless the model listens (VAD), hears (transcription) and
    speaks."""
    missing = [what for what, ok in (
        ("voice activity detection", audio_input.has_vad(model.omni)),
        ("speech recognition", audio_input.transcriber(model.omni) is not None),
        ("speech output", "audio" in model.modalities)) if not ok]
    if missing:
        raise APIError(400, f"model '{model.id}' cannot hold a duplex voice session: it has "
                       f"no {', no '.join(missing)}", param="model")


async def duplex(request: web.Request) -> web.StreamResponse:
    check_duplex_model(realtime_model(request))
    return await upgrade(request, DuplexConnection)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/duplex", duplex)
