"""GET /v1/world?model=ID: world-model sessions over a WebSocket (docs/worlds.md).

JSON control events in both directions; each chunk of frames is a ``chunk`` event
followed by ONE binary message: the frames as raw RGB, uint8, frame-major
(F x H x W x 3 bytes, shape in the event). A connection is one session: the first event
opens it, closing the socket ends it. Errors are ``error`` events and the connection
stays; a connection beyond ``max_sessions`` is closed with 1013, a bad key gets 401
before the upgrade.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from typing import Any

import numpy as np
from aiohttp import WSCloseCode, WSMsgType, web

from omni.api.errors import APIError
from omni.api.sockets import SOCKETS_KEY, SocketWork
from omni.api.state import MODELS_KEY, SETTINGS_KEY, ServedModel
from omni.errors import InvalidInputError, OmniError, RejectedInputError
from omni.media.image import MAX_IMAGE_PIXELS, check_image
from omni.session import Session, SessionCapacityError, SessionError

log = logging.getLogger("omni.api.world")
MAX_ACTION_ROWS = 4096

# The error codes of an ``error`` event: every one this endpoint sends, each listed in
# docs/worlds.md (a test checks both). The message says what exactly was wrong.
NO_SESSION = "no_session"  # an event that needs the session before session.open
UNKNOWN_EVENT = "unknown_event"  # a type that is not an event of this endpoint
INVALID_REQUEST = "invalid_request"  # the client's to fix: resending it fails again
STEP_FAILED = "step_failed"  # the server could not run the step: a retry may work
SESSION_ERROR = "session_error"  # the session ended or cannot take the event now
SESSION_LIMIT_REACHED = "session_limit_reached"  # then close 1013
ERROR_CODES = (NO_SESSION, UNKNOWN_EVENT, INVALID_REQUEST, STEP_FAILED, SESSION_ERROR,
               SESSION_LIMIT_REACHED)


def world_model(request: web.Request) -> ServedModel:
    models = request.app[MODELS_KEY]
    model_id = request.query.get("model")
    worlds = [m.id for m in models if "world_model" in _tasks(m)]
    if not model_id:
        raise APIError(400, "the 'model' query parameter is required, e.g. /v1/world?model="
                       f"{worlds[0] if worlds else 'MODEL'}", param="model")
    model = models.get(model_id)
    if model.id not in worlds:
        raise APIError(400, f"model '{model.id}' is not a world model", param="model")
    return model


def _tasks(model: ServedModel) -> list[str]:
    for stage in model.omni.pipeline.outputs.get("video", ()):
        tasks = model.omni.stage_info(stage).get("tasks")
        if tasks:
            return list(tasks)
    return []


class ClientError(Exception):
    def __init__(self, message: str, code: str = INVALID_REQUEST) -> None:
        super().__init__(message)
        self.code = code


async def world_socket(request: web.Request) -> web.WebSocketResponse:
    model = world_model(request)
    sockets = request.app[SOCKETS_KEY]
    sockets.admit()  # a draining server: 503 before the upgrade
    settings = request.app[SETTINGS_KEY]
    ws = web.WebSocketResponse(max_msg_size=settings.max_request_bytes, heartbeat=30.0)
    await ws.prepare(request)
    connection = WorldConnection(ws, model)
    try:
        async with sockets.hold(connection.work):
            await connection.run()
    finally:
        connection.close()
    return ws


class WorldConnection:
    def __init__(self, ws: web.WebSocketResponse, model: ServedModel) -> None:
        self.ws, self.model = ws, model
        self.session: Session | None = None
        self.work = SocketWork(ws)  # a drain lets the step in flight send its chunks

    async def send(self, kind: str, **fields: Any) -> None:
        await self.ws.send_json({"type": kind, **fields})

    async def error(self, message: str, code: str = INVALID_REQUEST) -> None:
        await self.send("error", error={"code": code, "message": message})

    async def run(self) -> None:
        async for message in self.ws:
            if message.type != WSMsgType.TEXT:
                if message.type == WSMsgType.BINARY:
                    await self.error("send JSON events as text messages")
                    continue
                break
            try:
                with self.work.busy():
                    await self.handle(parse_event(message.data))
            except ClientError as exc:
                await self.error(str(exc), exc.code)
            except (ValueError, InvalidInputError, RejectedInputError) as exc:
                # the front's or the model's refusal of what the client sent (a bad
                # domain, actions of another width, a step on an evicted session: reset)
                await self.error(str(exc), INVALID_REQUEST)
            except SessionCapacityError as exc:
                await self.error(str(exc), SESSION_LIMIT_REACHED)
                await self.ws.close(code=WSCloseCode.TRY_AGAIN_LATER, message=b"too many sessions")
                return
            except SessionError as exc:
                await self.error(str(exc), SESSION_ERROR)
            except OmniError as exc:  # a failed stage, a dead replica, a deadline, capacity
                await self.error(str(exc), STEP_FAILED)

    async def handle(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "session.open":
            await self.open(event)
        elif kind == "close":  # with or without a session: it was answered with no_session
            await self.ws.close()
        elif kind not in ("step", "reset"):
            raise ClientError(f"unknown event type {kind!r}; the events are session.open, "
                              "step, reset, close", UNKNOWN_EVENT)
        elif self.session is None:
            raise ClientError("open the session first ('session.open')", NO_SESSION)
        elif kind == "step":
            await self.step(event)
        else:
            self.model.omni.reset_world(self.session.id)
            await self.send("session.reset", session_id=self.session.id)

    async def open(self, event: dict[str, Any]) -> None:
        if self.session is not None:
            raise ClientError("this connection's session is open already")
        image = first_frame(event)
        defaults = {k: event[k] for k in ("seed", "steps", "chunk_size", "guidance_scale",
                                          "view_point") if k in event}
        self.session = self.model.omni.open_world(image, event.get("prompt"),
                                                  event.get("domain"), **defaults)
        log.info("world session %s opened (%s)", self.session.id, event.get("domain"))
        await self.send("session.created", session={
            "id": self.session.id, "model": self.model.id, "domain": event.get("domain"),
            "frame_encoding": "rgb24"})

    async def step(self, event: dict[str, Any]) -> None:
        array = parse_actions(event.get("actions"))
        params = {k: event[k] for k in ("seed", "steps") if k in event}
        async for out in self.model.omni.world_step(self.session.id, array, **params):
            data = out.data or {}
            if "progress" in data:
                await self.send("step.progress", **data["progress"])
            if "video" in data:
                await self.chunk(data)

    async def chunk(self, data: dict[str, Any]) -> None:
        frames = data["video"]
        frames = frames.numpy() if hasattr(frames, "numpy") else np.asarray(frames)
        count, height, width = (int(n) for n in frames.shape[:3])
        await self.send("chunk", index=data.get("chunk"), frames=count, height=height,
                        width=width, channels=3, fps=data.get("fps"), encoding="rgb24",
                        bytes=int(frames.nbytes), seed=data.get("seed"),
                        steps=data.get("steps"), denoise_s=data.get("denoise_s"))
        await self.ws.send_bytes(np.ascontiguousarray(frames, dtype=np.uint8).tobytes())

    def close(self) -> None:
        if self.session is not None:
            self.model.omni.close_session(self.session.id, "the client disconnected")


def parse_event(raw: str) -> dict[str, Any]:
    """One text frame -> its event; ClientError unless a JSON object with a string type
    (RecursionError is what json.loads raises for a deeply nested frame)."""
    try:
        event = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise ClientError(f"the event is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise ClientError("an event is a JSON object with a 'type'")
    return event


def first_frame(event: dict[str, Any]) -> bytes:
    """session.open's ``image``: a base64 image file whose header is within the pixel
    limit (read before anything decodes it); ClientError otherwise."""
    try:
        image = base64.b64decode(event.get("image") or "", validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise ClientError("'image' must be a base64 image file (PNG, JPEG)") from None
    if not image:
        raise ClientError("'image' (the first frame, base64 PNG or JPEG) is required")
    try:
        check_image(image, MAX_IMAGE_PIXELS)
    except ValueError as exc:
        raise ClientError(f"'image': {exc}") from None
    return image


def parse_actions(actions: Any) -> np.ndarray:
    """A step's ``actions``: float32 (rows, width); ClientError otherwise (a number
    beyond float range too: numpy raises OverflowError for it)."""
    if not isinstance(actions, list) or not actions or len(actions) > MAX_ACTION_ROWS:
        raise ClientError(f"'actions' must be a list of 1..{MAX_ACTION_ROWS} rows")
    try:
        array = np.asarray(actions, dtype=np.float32)
    except (TypeError, ValueError, OverflowError):
        raise ClientError("'actions' rows must be lists of numbers of one width") from None
    if array.ndim != 2:
        raise ClientError("'actions' rows must be lists of numbers of one width")
    return array


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/world", world_socket)
