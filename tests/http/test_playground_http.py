"""The playground's HTTP side (omni/api/ui): the page and its files load without the API
key and hold everything they load (no CDN); the API keeps requiring the key; an upgrade at
/ still goes to OpenPI; --no-ui gives / back to OpenPI alone. The page in a browser:
tests/e2e/test_playground_*."""

from __future__ import annotations

import re
from importlib import resources

import pytest
import yarl
from httputil import ServerSettings, assert_error_object, run

from omni.server import parse_args

KEY = "page-key"
STATIC = resources.files("omni.api.ui") / "static"
TYPES = {"js": "text/javascript", "css": "text/css", "svg": "image/svg+xml",
         "html": "text/html"}


@pytest.fixture(scope="module")
def servers(start_server):
    settings = ServerSettings(api_key=KEY, drain_timeout_s=2.0)
    return (start_server({"echo": "echo"}, settings),
            start_server({"echo": "echo"}, ServerSettings(api_key=KEY, drain_timeout_s=2.0,
                                                          ui=False)))


def referenced_files() -> set[str]:
    """Every file the page loads: /ui/ URLs in the HTML, CSS and JS, and ./x.js imports."""
    names = set()
    for entry in STATIC.iterdir():
        text = entry.read_text()
        names |= set(re.findall(r"/ui/([\w.-]+)", text))
        names |= set(re.findall(r"from \"\./([\w.-]+)\"", text))
    return names


def test_the_page_and_its_files_load_without_the_key(servers):
    ui_server, _ = servers
    files = {entry.name for entry in STATIC.iterdir()}
    assert referenced_files() <= files  # nothing the page loads is missing
    assert {"index.html", "main.js", "worklets.js", "app.css"} <= files

    async def body():
        async with ui_server.session() as http:
            async with http.get("/") as page:
                assert page.status == 200 and page.content_type == "text/html"
                assert "default-src 'self'" in page.headers["Content-Security-Policy"]
                assert page.headers["X-Content-Type-Options"] == "nosniff"
                assert '<script type="module" src="/ui/main.js">' in await page.text()
            for name in sorted(files):
                async with http.get(f"/ui/{name}") as resp:
                    assert resp.status == 200, name
                    assert resp.content_type == TYPES[name.rsplit(".", 1)[1]], name
                    # everything comes from this server: no CDN, no other origin (an
                    # SVG's XML namespace is a name, not a place)
                    text = (await resp.text()).replace('xmlns="http://www.w3.org/2000/svg"', "")
                    assert not re.search(r"https?://", text), name
            # a fixed set of files: a name that climbs out names none of them
            async with http.get(yarl.URL("/ui/..%2F__init__.py", encoded=True)) as resp:
                assert resp.status == 404
            async with http.get("/ui/nope.js") as resp:
                assert resp.status == 404
                assert_error_object(await resp.json())
    run(body())


def test_the_api_still_needs_the_key(servers):
    ui_server, _ = servers

    async def body():
        async with ui_server.session() as http:
            for path in ("/v1/models", "/openapi.json", "/v1/audio/voices"):
                async with http.get(path) as resp:
                    assert resp.status == 401, path
                    assert_error_object(await resp.json(), code="invalid_api_key")
            async with http.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}) \
                    as resp:
                assert resp.status == 200
            # an upgrade at / is OpenPI's, and needs the key as before
            async with http.get("/", headers={"Upgrade": "websocket", "Connection": "Upgrade",
                                              "Sec-WebSocket-Version": "13",
                                              "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}) \
                    as resp:
                assert resp.status == 401
            async with http.get("/", headers={"Upgrade": "websocket", "Connection": "Upgrade",
                                              "Sec-WebSocket-Version": "13",
                                              "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                                              "Authorization": f"Bearer {KEY}"}) as resp:
                assert resp.status == 404  # past the key: this server serves no policy
                assert "no robot policy" in (await resp.json())["error"]["message"]
    run(body())


def test_no_ui_gives_slash_back_to_openpi(servers):
    _, plain = servers

    async def body():
        async with plain.session() as http:
            for path in ("/", "/ui/main.js"):
                async with http.get(path) as resp:
                    assert resp.status == 401, path  # nothing open beyond the API's own
            headers = {"Authorization": f"Bearer {KEY}"}
            async with http.get("/", headers=headers) as resp:
                assert resp.status == 404 and "no robot policy" in \
                    (await resp.json())["error"]["message"]
            async with http.get("/ui/main.js", headers=headers) as resp:
                assert resp.status == 404
            async with http.get("/health") as resp:
                assert resp.status == 200
    run(body())


def test_the_flag():
    assert parse_args([]).ui is True
    assert parse_args(["--no-ui"]).ui is False
