"""Transcription sessions: GET /v1/realtime?intent=transcription (protocols.md §10.11).

Speech in, its transcript out, no answers: the client appends audio; a turn ends by the
server VAD (``server_vad`` or ``semantic_vad``) or by ``input_audio_buffer.commit``; the
turn's transcript comes as ``conversation.item.input_audio_transcription.delta`` events,
then ``.completed``. It is a realtime connection (the same buffer, VAD turns and
transcription as a voice session's input) that takes fewer events and never responds.

GA clients connect with no model (``client.realtime.connect(extra_query={"intent":
"transcription"})``) and send ``session.update`` with ``session.type: "transcription"``;
beta clients must send a model and send ``transcription_session.update``, answered as
``transcription_session.created`` / ``.updated``. A ``?model=`` that is served picks the
pipeline (it must transcribe); one that is not (OpenAI names such as gpt-4o-transcribe)
is ignored, as OpenAI ignores it, and the first served model that transcribes is used.
So is ``transcription.model``: a served model's id switches the recognizer to it.
"""

from __future__ import annotations

from typing import Any

import omni.api.realtime.audio_input as audio_input
from omni.api.realtime.config import VAD_DEFAULTS, ClientError, ConfigError, SessionConfig
from omni.api.realtime.connection import HANDLERS, RealtimeConnection
from omni.api.state import ModelRegistry, ServedModel

BETA_SESSION_NAMES = {"session.created": "transcription_session.created",
                      "session.updated": "transcription_session.updated"}
ANSWERING = ("response.create", "response.cancel", "conversation.item.create",
             "conversation.item.truncate")
TRANSCRIPTION_HANDLERS = {
    **{kind: name for kind, name in HANDLERS.items() if kind not in ANSWERING},
    "transcription_session.update": "session_update",
    **{kind: "refuse_answering" for kind in ANSWERING},
}


class NoTranscriber(Exception):
    """No served model can transcribe what this connection asked for; ``param`` names
    where it was asked."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def transcribing_model(models: ModelRegistry, requested: str | None) -> ServedModel:
    """The pipeline a transcription session runs on (see module doc): a served model over
    the whole pipeline, whose engines hold the session; NoTranscriber when there is none."""
    if requested in models.by_id:
        model = models.by_id[requested]
        if audio_input.transcriber(model.omni) is None:
            raise NoTranscriber(f"model '{model.id}' cannot transcribe speech (it has no "
                                "speech recognition stage)", "model")
    else:
        model = next((m for m in models if audio_input.transcriber(m.omni) is not None), None)
        if model is None:
            raise NoTranscriber("no served model transcribes speech", "model")
    return ServedModel(model.id, getattr(model.omni, "parent", model.omni))


class TranscriptionConnection(RealtimeConnection):
    kind = "transcription"

    def __init__(self, *args: Any, models: ModelRegistry, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.models = models

    @property
    def handlers(self) -> dict[str, str]:
        return TRANSCRIPTION_HANDLERS

    def _default_config(self) -> SessionConfig:
        vad = audio_input.has_vad(self.omni)
        turns = {**VAD_DEFAULTS, "create_response": False, "interrupt_response": False}
        return SessionConfig(self.model.id, ["text"], None, (), kind=self.kind,
                             turn_detection=turns if vad else None)

    async def send(self, event: dict[str, Any]) -> None:
        if self.beta and event["type"] in BETA_SESSION_NAMES:
            event = {**event, "type": BETA_SESSION_NAMES[event["type"]]}
        await super().send(event)

    async def session_update(self, event: dict[str, Any]) -> None:
        """As a voice session's, plus ``transcription.model`` (GA ``audio.input``, beta
        ``input_audio_transcription``): a served model's id must transcribe."""
        session = event.get("session")
        audio = session.get("audio") if isinstance(session, dict) else None
        audio_in = audio.get("input") if isinstance(audio, dict) else None
        for where, param in ((audio_in, "session.audio.input.transcription.model"),
                             (session, "session.input_audio_transcription.model")):
            key = "transcription" if where is audio_in else "input_audio_transcription"
            wanted = where.get(key) if isinstance(where, dict) else None
            if isinstance(wanted, dict) and wanted.get("model") in self.models.by_id:
                self.listener = self._listener_of(wanted["model"], param)
        await super().session_update(event)

    def _listener_of(self, model_id: str, param: str) -> Any:
        listener = audio_input.transcriber(self.models.by_id[model_id].omni)
        if listener is None:
            raise ConfigError(f"model '{model_id}' cannot transcribe speech", param)
        self.turns.listener = listener
        return listener

    async def _item_added(self, item: Any, previous: str | None) -> None:
        """A transcription session has no conversation: its items are not announced."""

    async def response_create(self, event: dict[str, Any]) -> None:
        """The VAD's end of turn asks for no answer here (its create_response is off)."""

    async def refuse_answering(self, event: dict[str, Any]) -> None:
        raise ClientError(f"{event['type']} is not available in a transcription session: "
                          "it only transcribes (connect without intent=transcription for "
                          "a conversation)", "invalid_event", "type")
