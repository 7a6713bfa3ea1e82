"""/health, /v1/models, /metrics."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from omni.api.errors import APIError
from omni.api.state import METRICS_KEY, MODELS_KEY


async def health(request: web.Request) -> web.Response:
    """200 when every stage of every served pipeline has a live replica, else 503."""
    report = {m.id: m.omni.health() for m in request.app[MODELS_KEY]}
    healthy = all(r["healthy"] for r in report.values())
    status = "ok" if healthy else "unavailable"
    return web.json_response({"status": status, "models": report},
                             status=200 if healthy else 503)


async def list_models(request: web.Request) -> web.Response:
    cards = [m.card() for m in request.app[MODELS_KEY]]
    return web.json_response({"object": "list", "data": cards})


async def get_model(request: web.Request) -> web.Response:
    model_id = request.match_info["model"]
    models = request.app[MODELS_KEY]
    if model_id not in models.by_id:
        raise APIError(404, f"model '{model_id}' is not served here; served: {models.listing()}",
                       param="model", code="model_not_found")
    return web.json_response(models.by_id[model_id].card())


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS_KEY].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", get_model)
