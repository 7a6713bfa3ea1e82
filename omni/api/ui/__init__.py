"""The browser playground (issue #42): ``GET /`` serves a small page that drives this
server's own API, and ``/ui/{file}`` its static files.

Why a framework-free page (ES modules, one CSS file, no build step): nothing to compile
at install or run time, no toolchain in CI, and everything it loads comes from this
server (no CDN; the Content-Security-Policy below says so to the browser too).

``/`` is shared with the OpenPI robot-policy WebSocket: an upgrade goes to OpenPI, a
plain GET gets the page. The page and its files are the only things served without the
API key (they hold no server data); every call the page makes carries the key, so the
page never exposes more than the API already does. ``--no-ui`` turns all of it off.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

from omni.api import openpi
from omni.api.errors import APIError
from omni.api.state import SETTINGS_KEY

STATIC_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css",
                ".svg": "image/svg+xml"}
PAGE = "index.html"
ASSET_PREFIX = "/ui/"
# the page talks only to this server: scripts, styles, fetches and sockets from 'self';
# blob:/data: for the audio, images and videos it makes from API answers
CSP = ("default-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data: blob:; "
       "media-src 'self' blob: data:; object-src 'none'; base-uri 'none'; "
       "frame-ancestors 'none'")


def _static_files() -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, content type), read once: a fixed set, so a request can name
    nothing outside it (no path traversal to guard against)."""
    folder = resources.files(__package__) / "static"
    files = {}
    for entry in folder.iterdir():
        kind = STATIC_TYPES.get("." + entry.name.rsplit(".", 1)[-1])
        if kind is not None and entry.is_file():
            files[entry.name] = (entry.read_bytes(), kind)
    return files


def is_websocket(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower() == "websocket"


def is_open_page(request: web.Request) -> bool:
    """The page and its files load without the API key (an upgrade at / does not)."""
    if not request.app[SETTINGS_KEY].ui:
        return False
    if request.path == "/":
        return not is_websocket(request)
    return request.path.startswith(ASSET_PREFIX)


def _file_response(name: str, files: dict[str, tuple[bytes, str]]) -> web.Response:
    body, kind = files[name]
    return web.Response(body=body, content_type=kind, charset="utf-8", headers={
        "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": CSP, "Referrer-Policy": "no-referrer"})


def add_routes(app: web.Application) -> None:
    files = _static_files() if app[SETTINGS_KEY].ui else {}

    async def root(request: web.Request) -> web.StreamResponse:
        if not files or is_websocket(request):
            return await openpi.policy_socket(request)
        return _file_response(PAGE, files)

    async def asset(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in files:
            raise APIError(404, f"the playground has no file '{name}'", code="not_found")
        return _file_response(name, files)

    app.router.add_get("/", root)
    if files:
        app.router.add_get(ASSET_PREFIX + "{name}", asset)
