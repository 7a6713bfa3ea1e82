"""The realtime WebSocket API (GET /v1/realtime): the upgrade, then one connection."""

from __future__ import annotations

import logging

from aiohttp import WSCloseCode, web

from omni.api.errors import APIError
from omni.api.realtime.connection import RealtimeConnection
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


async def upgrade(request: web.Request, connection_class: type = RealtimeConnection
                  ) -> web.WebSocketResponse:
    model = realtime_model(request)
    settings = request.app[SETTINGS_KEY]
    ws = web.WebSocketResponse(protocols=SUBPROTOCOLS, max_msg_size=settings.max_request_bytes,
                               heartbeat=30.0)
    try:
        session = await open_or_resume(request, model)
    except SessionCapacityError as exc:
        await ws.prepare(request)
        await ws.send_json({"type": "error", "event_id": None, "error": {
            "type": "server_error", "code": "session_limit_reached", "message": str(exc),
            "param": None, "event_id": None}})
        await ws.close(code=WSCloseCode.TRY_AGAIN_LATER, message=b"too many sessions")
        return ws
    await ws.prepare(request)
    connection = connection_class(ws, model, session, is_beta(request),
                                  settings.max_audio_seconds)
    log.info("session %s: %s connected (%s)", session.id, request.remote,
             "beta" if connection.beta else "GA")
    try:
        await connection.run()
    finally:
        await connection.close()
        log.info("session %s: client left (close code %s)", session.id, ws.close_code)
    return ws


async def realtime(request: web.Request) -> web.StreamResponse:
    return await upgrade(request)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/realtime", realtime)
