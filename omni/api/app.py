"""The aiohttp app factory: served models, auth, size limits, and engine lifetime."""

from __future__ import annotations

import hmac
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from omni.api.errors import MAX_BYTES_KEY, APIError, error_middleware
from omni.media.fetch import FetchPolicy
from omni.runtime.async_omni import AsyncOmni
from omni.runtime.metrics import Metrics

# outputs the realtime layer reads (speech started / stopped), not answers a client asks
# for: left off the model card
SIGNAL_MODALITIES = ("voice_activity",)


@dataclass
class ServedModel:
    """One pipeline as the API sees it: an id clients put in ``model``, and its runtime."""

    id: str
    omni: AsyncOmni
    created: int = field(default_factory=lambda: int(time.time()))
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def modalities(self) -> tuple[str, ...]:
        return self.omni.pipeline.modalities

    @property
    def input_modalities(self) -> tuple[str, ...]:
        return self.omni.pipeline.input_modalities

    def card(self) -> dict[str, Any]:
        """The /v1/models entry; extra keys beyond OpenAI's are ignored by clients."""
        return {"id": self.id, "object": "model", "created": self.created, "owned_by": "omni",
                "modalities": [m for m in self.modalities if m not in SIGNAL_MODALITIES],
                "input_modalities": list(self.input_modalities), **self.metadata}


class ModelRegistry:
    """Served models by id; handlers look models up here and nowhere else."""

    def __init__(self, models: list[ServedModel]) -> None:
        self.by_id = {m.id: m for m in models}

    def __iter__(self) -> Any:
        return iter(self.by_id.values())

    def get(self, model_id: Any) -> ServedModel:
        if not isinstance(model_id, str) or not model_id:
            raise APIError(400, "'model' is required: one of " + self.listing(), param="model")
        model = self.by_id.get(model_id)
        if model is None:
            raise APIError(404, f"model '{model_id}' is not served here; served: "
                           f"{self.listing()}", param="model", code="model_not_found")
        return model

    def producing(self, modality: str) -> list[ServedModel]:
        return [m for m in self if modality in m.modalities]

    def listing(self) -> str:
        return ", ".join(f"{m.id} ({'+'.join(m.modalities)})" for m in self)


@dataclass(frozen=True)
class ServerSettings:
    api_key: str | None = None
    max_request_bytes: int = 16 * 1024 * 1024
    drain_timeout_s: float = 30.0
    max_speech_chars: int = 4096  # OpenAI's limit for /v1/audio/speech input
    max_audio_bytes: int = 25 * 1024 * 1024  # an uploaded audio file (OpenAI's limit)
    max_audio_seconds: float = 300.0  # decoded audio; it rides in one control message
    data_dir: str | None = None  # video jobs and files (None: video_jobs.default_data_dir)
    video_retention_s: float = 24 * 3600.0  # finished videos are deleted after this
    max_video_jobs: int = 16  # queued + running video jobs; beyond: 429
    media_fetch: FetchPolicy = field(default_factory=FetchPolicy)  # media URLs in requests
    policy_seed: int | None = None  # OpenPI: call k of a connection draws seed + k
    max_observation_bytes: int = 64 * 1024 * 1024  # one OpenPI frame (several cameras)


def live_output_info(model: ServedModel, modality: str) -> dict[str, Any]:
    """What the stage giving ``modality`` reported at load; a 503 while none is live."""
    info = model.omni.output_info(modality)
    if not info:
        raise APIError(503, f"model '{model.id}' has no live {modality} stage right now; "
                       "retry shortly", "server_error", code="stage_unavailable",
                       headers={"retry-after": "5"})
    return info


MODELS_KEY = web.AppKey("models", ModelRegistry)
METRICS_KEY = web.AppKey("metrics", Metrics)
SETTINGS_KEY = web.AppKey("settings", ServerSettings)
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
        if request.path not in OPEN_PATHS:
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
    from omni.api import routes

    settings = settings or ServerSettings()
    middlewares = [error_middleware]
    if settings.api_key:
        middlewares.append(_auth_middleware(settings.api_key))
    app = web.Application(middlewares=middlewares, client_max_size=settings.max_request_bytes)
    app[MODELS_KEY] = ModelRegistry(models)
    app[METRICS_KEY] = metrics
    app[SETTINGS_KEY] = settings
    app[MAX_BYTES_KEY] = settings.max_request_bytes
    app.cleanup_ctx.append(_engines_ctx)
    routes.add_routes(app)
    return app
