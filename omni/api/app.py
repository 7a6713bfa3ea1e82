"""The aiohttp app factory: served models, auth, size limits, and engine lifetime."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from omni.api import routes, ui
from omni.api.errors import MAX_BYTES_KEY, APIError, error_middleware
from omni.api.sockets import SOCKETS_KEY, OpenSockets
from omni.api.state import (
    METRICS_KEY,
    MODELS_KEY,
    SETTINGS_KEY,
    ModelRegistry,
    ServedModel,
    ServerSettings,
)
from omni.runtime.metrics import Metrics

OPEN_PATHS = ("/health", "/metrics", "/healthz")
WS_KEY_PREFIX = "openai-insecure-api-key."


def _auth_middleware(api_key: str) -> Any:
    expected = f"Bearer {api_key}".encode()

    def subprotocol_key(request: web.Request) -> bytes:
        """A browser's WebSocket cannot set headers: OpenAI's convention sends the key as
        the subprotocol ``openai-insecure-api-key.<key>``."""
        for name in request.headers.get("Sec-WebSocket-Protocol", "").split(","):
            name = name.strip()
            if name.startswith(WS_KEY_PREFIX):
                return f"Bearer {name[len(WS_KEY_PREFIX):]}".encode("utf-8", "surrogateescape")
        return b""

    @web.middleware
    async def auth(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path not in OPEN_PATHS and not ui.is_open_page(request):
            # surrogateescape: a header with undecodable bytes is a wrong key, not a crash
            given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
            if not given and request.headers.get("Upgrade", "").lower() == "websocket":
                given = subprotocol_key(request)
            if given.startswith(b"Api-Key "):  # openpi-client's header
                given = b"Bearer " + given[len(b"Api-Key "):]
            if not hmac.compare_digest(given, expected):
                raise APIError(401, "invalid or missing API key (send 'Authorization: Bearer "
                               "<key>')", code="invalid_api_key")
        return await handler(request)

    return auth


async def _engines_ctx(app: web.Application) -> AsyncIterator[None]:
    """Engines of every served pipeline start together and stop together."""
    import asyncio

    models = list(app[MODELS_KEY])
    results = await asyncio.gather(*(m.omni.start() for m in models), return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        await asyncio.gather(*(m.omni.close(0) for m in models), return_exceptions=True)
        raise failed[0]
    yield
    timeout = app[SETTINGS_KEY].drain_timeout_s
    await asyncio.gather(*(m.omni.close(timeout) for m in models))


def build_app(models: list[ServedModel], metrics: Metrics,
              settings: ServerSettings | None = None) -> web.Application:
    """The whole HTTP surface; engines start with the app and stop with it."""
    settings = settings or ServerSettings()
    middlewares = [error_middleware]
    if settings.api_key:
        middlewares.append(_auth_middleware(settings.api_key))
    app = web.Application(middlewares=middlewares, client_max_size=settings.max_request_bytes)
    app[MODELS_KEY] = ModelRegistry(models)
    app[METRICS_KEY] = metrics
    app[SETTINGS_KEY] = settings
    app[MAX_BYTES_KEY] = settings.max_request_bytes
    app[SOCKETS_KEY] = OpenSockets()  # WebSocket sessions, closed 1001 by a drain
    app.cleanup_ctx.append(_engines_ctx)
    routes.add_routes(app)
    return app
