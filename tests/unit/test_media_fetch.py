"""Media URLs: data: decoding, the fetch policy, size caps, deadlines, refused schemes."""

from __future__ import annotations

import asyncio
import base64

import pytest
from aiohttp import web

from omni.media.fetch import FetchPolicy, MediaError, decode_data_url, load


def test_data_urls_decode_base64_and_percent_encoding():
    media = decode_data_url("data:image/png;base64," + base64.b64encode(b"\x89PNG").decode(),
                            100)
    assert media.data == b"\x89PNG" and media.mime == "image/png"
    assert decode_data_url("data:,a%20b", 100).data == b"a b"
    with pytest.raises(MediaError, match="not valid base64"):
        decode_data_url("data:image/png;base64,@@@", 100)
    with pytest.raises(MediaError, match="larger than 4 bytes"):
        decode_data_url("data:;base64," + base64.b64encode(b"12345").decode(), 4)
    with pytest.raises(MediaError, match="','"):
        decode_data_url("data:image/png;base64", 100)


@pytest.mark.parametrize("url, message", [
    ("file:///etc/passwd", "file URLs are refused"),
    ("ftp://example.com/x", "ftp URLs are refused"),
    ("/etc/passwd", "scheme-less URLs are refused"),
    (42, "non-empty string"),
])
def test_other_schemes_are_refused(url, message):
    with pytest.raises(MediaError, match=message):
        asyncio.run(load(url, FetchPolicy(mode="all")))


def test_off_and_public_modes_do_not_reach_local_addresses():
    with pytest.raises(MediaError, match="does not fetch URLs"):
        asyncio.run(load("http://127.0.0.1:1/x", FetchPolicy(mode="off")))
    for host in ("127.0.0.1", "10.1.2.3", "169.254.169.254", "[::1]"):
        with pytest.raises(MediaError, match="non-public address"):
            asyncio.run(load(f"http://{host}/x", FetchPolicy(mode="public")))


async def _with_server(check):
    async def small(request):
        return web.Response(body=b"x" * 100, content_type="image/png")

    async def big(request):
        response = web.StreamResponse()  # chunked: no Content-Length to trust
        await response.prepare(request)
        for _ in range(10):
            await response.write(b"y" * 1000)
        return response

    async def slow(request):
        await asyncio.sleep(1.5)
        return web.Response(body=b"late")

    async def moved(request):
        raise web.HTTPFound("/small")

    app = web.Application()
    app.router.add_get("/small", small)
    app.router.add_get("/big", big)
    app.router.add_get("/slow", slow)
    app.router.add_get("/moved", moved)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        await check(f"http://127.0.0.1:{runner.addresses[0][1]}")
    finally:
        await runner.cleanup()


def test_fetch_with_size_cap_deadline_and_no_redirects():
    policy = FetchPolicy(mode="all", max_bytes=5000, timeout_s=0.5)

    async def check(base):
        media = await load(f"{base}/small", policy)
        assert media.data == b"x" * 100 and media.mime == "image/png"
        with pytest.raises(MediaError, match="larger than 5000 bytes"):
            await load(f"{base}/big", policy)
        with pytest.raises(MediaError, match="longer than 0.5 s"):
            await load(f"{base}/slow", policy)
        with pytest.raises(MediaError, match="redirects are not followed"):
            await load(f"{base}/moved", policy)
        with pytest.raises(MediaError, match="HTTP 404"):
            await load(f"{base}/missing", policy)
    asyncio.run(_with_server(check))
