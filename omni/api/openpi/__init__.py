"""The OpenPI robot-policy WebSocket, for an unmodified openpi-client (protocols.md §7).

- ``ws://HOST:PORT/`` (routed here by omni/api/ui, which shares ``/`` with the
  playground page) reaches the served policy when exactly one is served; every policy is
  also at ``ws://HOST:PORT/openpi/{model}`` (clients pass that whole URL as ``host``).
  ``GET /healthz`` answers 200 "OK" as openpi's reference server does.
- A key set on the server is checked before the upgrade: ``Authorization: Api-Key <key>``
  (openpi-client's header) or ``Bearer <key>``; a wrong one gets HTTP 401.
- Each connection is a session (kind "policy", its episode): the metadata frame first,
  then strict lockstep, one observation -> one action dict. Seeds: ``--policy-seed`` S
  gives call k of every connection the seed S + k (a robot's run is reproducible whatever
  the others do); unset, each connection draws a random S. An integer ``seed`` key in an
  observation overrides it for that call.
- Errors are text frames (the client raises RuntimeError with the text): bad input keeps
  the connection; a failure of the policy closes it with 1011, or 1013 while the policy
  has no live replica (reconnect later); a full server (``max_sessions``) closes with 1013.
- A stopping server (SIGTERM) answers the observation in flight, then closes with 1001
  (omni/api/sockets.py); an upgrade during its drain gets HTTP 503.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from omni.api.errors import APIError
from omni.api.openpi import codec
from omni.api.sockets import SOCKETS_KEY, SocketWork
from omni.api.state import MODELS_KEY, SETTINGS_KEY, ServedModel
from omni.errors import (
    AdmissionError,
    InvalidInputError,
    OmniError,
    RejectedInputError,
    RequestFailedError,
)
from omni.session import Session, SessionCapacityError, SessionError
from omni.wire.arrays import pack_tree

log = logging.getLogger("omni.api.openpi")
MODALITY = "actions"


def policies(request: web.Request) -> list[ServedModel]:
    return [m for m in request.app[MODELS_KEY] if MODALITY in m.modalities]


def policy_model(request: web.Request) -> ServedModel:
    name = request.match_info.get("model")
    if name is not None:
        model = request.app[MODELS_KEY].get(name)
        if MODALITY not in model.modalities:
            raise APIError(400, f"model '{model.id}' is not a robot policy", param="model")
        return model
    served = policies(request)
    if len(served) == 1:
        return served[0]
    if not served:
        raise APIError(404, "this server serves no robot policy", code="model_not_found")
    raise APIError(400, "this server serves several policies; connect to one of "
                   + ", ".join(f"/openpi/{m.id}" for m in served), param="model")


def has_live_replica(model: ServedModel) -> bool:
    stages = model.omni.pipeline.outputs.get(MODALITY, ())
    return any(model.omni.stage_info(stage) for stage in stages)


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="OK\n")


async def policy_socket(request: web.Request) -> web.StreamResponse:
    model = policy_model(request)
    if request.headers.get("Upgrade", "").lower() != "websocket":
        raise APIError(426, f"ws://{request.host}{request.path} is the OpenPI policy "
                       f"WebSocket of '{model.id}': connect with openpi-client",
                       code="upgrade_required")
    sockets = request.app[SOCKETS_KEY]
    sockets.admit()  # a draining server: 503 before the upgrade (the client raises)
    settings = request.app[SETTINGS_KEY]
    ws = web.WebSocketResponse(max_msg_size=settings.max_observation_bytes, compress=False,
                               heartbeat=30.0)
    try:
        session = model.omni.open_session("policy", {"model": model.id})
    except SessionCapacityError as exc:
        await _refuse(ws, request, f"too many robots connected: {exc}",
                      WSCloseCode.TRY_AGAIN_LATER)
        return ws
    try:
        if not has_live_replica(model):
            await _refuse(ws, request, f"policy '{model.id}' has no live replica right now; "
                          "reconnect shortly", WSCloseCode.TRY_AGAIN_LATER)
            return ws
        await ws.prepare(request)
        seed = settings.policy_seed if settings.policy_seed is not None \
            else secrets.randbits(62)
        connection = PolicyConnection(ws, model, session, seed)
        log.info("session %s: robot %s connected to %s", session.id, request.remote, model.id)
        async with sockets.hold(connection.work):
            await connection.run()
        log.info("session %s: robot left after %d calls (close code %s)", session.id,
                 connection.calls, ws.close_code)
    finally:
        model.omni.close_session(session.id, "the server shut down" if sockets.draining
                                 else "the robot disconnected")
    return ws


async def _refuse(ws: web.WebSocketResponse, request: web.Request, message: str,
                  code: int) -> None:
    await ws.prepare(request)
    await ws.send_str(message)
    await ws.close(code=code, message=message[:120].encode())


class PolicyConnection:
    """One robot: metadata, then observation -> actions in lockstep."""

    def __init__(self, ws: web.WebSocketResponse, model: ServedModel, session: Session,
                 seed: int) -> None:
        self.ws, self.model, self.session, self.seed = ws, model, session, seed
        self.work = SocketWork(ws)  # a drain lets the observation in flight be answered
        self.calls = 0
        self.prev_total_ms: float | None = None

    def metadata(self) -> dict[str, Any]:
        info: dict[str, Any] = {}
        for stage in self.model.omni.pipeline.outputs.get(MODALITY, ()):
            info = self.model.omni.stage_info(stage)
        return {"model": self.model.id, "policy": info.get("policy"),
                "action_horizon": info.get("horizon"), "action_dim": info.get("action_width"),
                "state_dim": info.get("state_width"), "cameras": info.get("cameras", []),
                "inputs": info.get("inputs"),
                "image_size": info.get("image_size"), "num_steps": info.get("steps"),
                "session_id": self.session.id}

    async def run(self) -> None:
        await self.ws.send_bytes(codec.packb(self.metadata()))
        async for message in self.ws:
            if message.type not in (WSMsgType.BINARY, WSMsgType.TEXT):
                break
            with self.work.busy():
                await self.answer(message.type, message.data)
            if self.ws.closed:
                break

    async def answer(self, kind: WSMsgType, data: Any) -> None:
        started = time.monotonic()
        if kind == WSMsgType.BINARY:
            reply = await self.infer(data, started)
        else:
            reply = "send each observation as one binary msgpack frame (openpi-client)"
        if isinstance(reply, bytes):
            await self.ws.send_bytes(reply)
            self.prev_total_ms = (time.monotonic() - started) * 1000
        elif reply is not None:
            await self.ws.send_str(reply)

    async def infer(self, frame: bytes, started: float) -> bytes | str | None:
        """The action dict for one frame, an error text (connection kept), or None after
        closing the connection."""
        try:
            given_seed, observation = parse_observation(frame)
            seed = self._seed(given_seed)
            request = {"observation": observation}
        except (ValueError, TypeError) as exc:
            return f"bad observation: {exc}"
        try:
            data = await self._run(request, seed)
        except (RejectedInputError, InvalidInputError) as exc:
            return f"bad observation: {exc}"
        except AdmissionError as exc:
            return f"the server is at capacity, retry: {exc}"
        except (RequestFailedError, SessionError, OmniError) as exc:
            await self._fail(exc)
            return None
        self.calls += 1
        actions = data["actions"].numpy().astype("float32")
        timing = {"infer_ms": (time.monotonic() - started) * 1000}
        if self.prev_total_ms is not None:
            timing["prev_total_ms"] = self.prev_total_ms
        return codec.packb({"actions": actions, "server_timing": timing,
                            "policy_timing": {"infer_ms": data.get("policy_ms"),
                                              "prepare_ms": data.get("prepare_ms")},
                            "seed": seed, "episode_step": data.get("episode_step")})

    def _seed(self, given: Any) -> int:
        if given is None:
            return (self.seed + self.calls) % 2**63
        if isinstance(given, bool) or not isinstance(given, int) or not 0 <= given < 2**63:
            raise ValueError(f"'seed' must be an integer from 0 to 2**63 - 1, got {given!r}")
        return int(given)

    async def _run(self, request: dict[str, Any], seed: int) -> dict[str, Any]:
        self.model.omni.sessions.manager.append(self.session.id, None)  # touches its lease
        result: dict[str, Any] | None = None
        async for out in self.model.omni.generate(
                request, modalities=[MODALITY], params={"*": {"seed": seed}},
                session=self.session):
            if out.modality == MODALITY and out.data and "actions" in out.data:
                result = out.data
        if result is None:
            raise RequestFailedError("the policy returned no actions")
        return result

    async def _fail(self, exc: Exception) -> None:
        live = has_live_replica(self.model)
        code = WSCloseCode.INTERNAL_ERROR if live else WSCloseCode.TRY_AGAIN_LATER
        log.warning("session %s: %s; closing with %d", self.session.id, exc, code)
        hint = "" if live else " (no live replica right now: reconnect shortly)"
        await self.ws.send_str(f"policy failed: {exc}{hint}")
        await self.ws.close(code=code, message=b"policy failed")


def parse_observation(frame: bytes) -> tuple[Any, dict[str, Any]]:
    """One binary frame -> (its ``seed`` value or None, the observation packed for the
    engine); ValueError saying what is wrong."""
    observation = codec.unpackb(frame)
    if not isinstance(observation, dict):
        raise ValueError("the observation must be a map")
    seed = observation.pop("seed", None)
    try:
        return seed, pack_tree(observation)
    except RecursionError:  # msgpack nests up to 1024 deep, Python recursion less
        raise ValueError("the observation is nested too deeply") from None


def add_routes(app: web.Application) -> None:
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/openpi/{model}", policy_socket)
