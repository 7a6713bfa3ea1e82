"""Helpers every streaming endpoint shares: the first output before the 200, SSE pings."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

SSE_PING_EVERY_S = 15.0


async def first_output(outputs: Any) -> Any:
    """The first output of a request, awaited before any header goes out, so that a
    request failing early still gets a proper error status."""
    try:
        return await anext(outputs)
    except BaseException:
        await outputs.aclose()
        raise


async def next_with_pings(outputs: Any, response: web.StreamResponse) -> Any:
    """The next output (None at the end); SSE comment pings keep idle connections (and
    proxies) alive meanwhile."""
    pending = asyncio.ensure_future(anext(outputs, None))
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=SSE_PING_EVERY_S)
            if done:
                return pending.result()
            await response.write(b": ping\n\n")
    finally:
        if not pending.done():  # settle it, so the generator can be closed after us
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)


def sse_data(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


async def start_sse(request: web.Request, request_id: str) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache",
                                           "X-Request-Id": request_id})
    await response.prepare(request)
    return response
