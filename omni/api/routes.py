"""Every endpoint family registers its routes here."""

from __future__ import annotations

from aiohttp import web

from omni.api import (
    chat,
    images,
    openapi,
    openpi,
    realtime,
    responses,
    speech,
    system,
    text,
    transcriptions,
    ui,
    videos,
    world,
)
from omni.api.realtime import duplex


def add_routes(app: web.Application) -> None:
    system.add_routes(app)
    text.add_routes(app)
    chat.add_routes(app)
    responses.add_routes(app)
    speech.add_routes(app)
    transcriptions.add_routes(app)
    realtime.add_routes(app)
    duplex.add_routes(app)
    images.add_routes(app)
    videos.add_routes(app)
    openpi.add_routes(app)
    ui.add_routes(app)  # "/": the page, or an upgrade to OpenPI
    world.add_routes(app)
    openapi.add_routes(app)
