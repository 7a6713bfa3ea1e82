"""The realtime WebSocket API (GET /v1/realtime): the upgrade, then one connection (a
voice / text session, or with ``?intent=transcription`` a transcription session)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from aiohttp import WSCloseCode, web

from omni.api.errors import APIError
from omni.api.realtime.connection import RealtimeConnection
from omni.api.realtime.transcription import (
    NoTranscriber,
    TranscriptionConnection,
    transcribing_model,
)
from omni.api.sockets import SOCKETS_KEY
from omni.api.state import MODELS_KEY, SETTINGS_KEY, ServedModel
from omni.session import Session, SessionCapacityError, SessionError

log = logging.getLogger("omni.api.realtime")
SUBPROTOCOLS = ("realtime",)  # browsers send the key as a subprotocol beside this one


def realtime_model(request: web.Request) -> ServedModel:
    """The ``?model=`` a session talks to: it must produce text (speech is optional)."""
    models = request.app[MODELS_KEY]
    model_id = request.query.get("model")
    if not model_id:
        talkers = [m.id for m in models if "text" in m.modalities]
        raise APIError(400, "the 'model' query parameter is required, e.g. "
                       f"/v1/realtime?model={talkers[0] if talkers else 'MODEL'}",
                       param="model")
    model = models.get(model_id)
    if "text" not in model.modalities:
        raise APIError(400, f"model '{model.id}' does not produce text; realtime sessions "
                       "need a model that answers", param="model")
    return model


def is_beta(request: web.Request) -> bool:
    beta = request.headers.get("OpenAI-Beta", "").replace(" ", "")
    protocols = request.headers.get("Sec-WebSocket-Protocol", "")
    return "realtime=v1" in beta or "openai-beta.realtime-v1" in protocols


async def open_or_resume(request: web.Request, model: ServedModel) -> Session:
    """The resumed session (``?resume_token=``; a 404 when there is none to resume) or a
    new one; SessionCapacityError when the pipeline is full."""
    manager = model.omni.sessions.manager
    token = request.query.get("resume_token")
    if token:
        try:
            return manager.attach(token)
        except SessionError as exc:
            raise APIError(404, str(exc), param="resume_token",
                           code="session_not_found") from None
    return model.omni.open_session("conversation", {"model": model.id})


def _socket(request: web.Request) -> web.WebSocketResponse:
    return web.WebSocketResponse(protocols=SUBPROTOCOLS, heartbeat=30.0,
                                 max_msg_size=request.app[SETTINGS_KEY].max_request_bytes)


async def refuse(request: web.Request, ws: web.WebSocketResponse, code: str, message: str,
                 param: str | None, close_code: WSCloseCode,
                 type_: str = "server_error") -> web.WebSocketResponse:
    """One ``error`` event, then the close: what a client that cannot be served hears."""
    await ws.prepare(request)
    await ws.send_json({"type": "error", "event_id": None, "error": {
        "type": type_, "code": code, "message": message, "param": param, "event_id": None}})
    await ws.close(code=close_code, message=code.encode())
    return ws


async def upgrade(request: web.Request,
                  connection_class: Callable[..., RealtimeConnection] = RealtimeConnection,
                  model: ServedModel | None = None) -> web.WebSocketResponse:
    model = model or realtime_model(request)
    sockets = request.app[SOCKETS_KEY]
    sockets.admit()  # a draining server: 503 before the upgrade (the SDK raises)
    settings = request.app[SETTINGS_KEY]
    ws = _socket(request)
    try:
        session = await open_or_resume(request, model)
    except SessionCapacityError as exc:
        return await refuse(request, ws, "session_limit_reached", str(exc), None,
                            WSCloseCode.TRY_AGAIN_LATER)
    await ws.prepare(request)
    connection = connection_class(ws, model, session, is_beta(request),
                                  settings.max_audio_seconds, settings.media_fetch)
    log.info("session %s: %s connected (%s)", session.id, request.remote,
             "beta" if connection.beta else "GA")
    try:
        async with sockets.hold(connection.work):
            await connection.run()
    finally:
        await connection.close()
        log.info("session %s: client left (close code %s)", session.id, ws.close_code)
    return ws


async def realtime(request: web.Request) -> web.StreamResponse:
    if request.query.get("intent") == "transcription":
        return await transcription(request)
    return await upgrade(request)


async def transcription(request: web.Request) -> web.StreamResponse:
    """A transcription session; a model that cannot transcribe is told so in an ``error``
    event (what the SDK's connection reports), then a 1008 close."""
    models = request.app[MODELS_KEY]
    try:
        model = transcribing_model(models, request.query.get("model"))
    except NoTranscriber as exc:
        return await refuse(request, _socket(request), "model_not_supported", str(exc),
                            exc.param, WSCloseCode.POLICY_VIOLATION, "invalid_request_error")
    return await upgrade(request, functools.partial(TranscriptionConnection, models=models),
                         model)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/realtime", realtime)
