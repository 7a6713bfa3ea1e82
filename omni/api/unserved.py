"""Endpoints of workload families this build does not serve yet.

They answer with an OpenAI error naming the served models, instead of a bare 404, so a
client pointed at the wrong server learns what it can ask for.
"""

from __future__ import annotations

from aiohttp import web

from omni.api.app import MODELS_KEY
from omni.api.errors import APIError

# path -> (method, the output modality the endpoint needs)
UNSERVED = {
    "/v1/realtime": ("GET", "audio"),
}


def _handler(modality: str) -> web.RequestHandler:
    async def not_served(request: web.Request) -> web.Response:
        models = request.app[MODELS_KEY]
        raise APIError(404, f"{request.path} (a {modality} endpoint) is not served by this "
                       f"server. Served models: {models.listing()}",
                       code="model_not_found", param="model")
    return not_served


def add_routes(app: web.Application) -> None:
    for path, (method, modality) in UNSERVED.items():
        app.router.add_route(method, path, _handler(modality))
