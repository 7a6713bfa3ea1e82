"""Media named by URL in a request (image_url, input_audio, video_url parts).

``data:`` URLs are decoded in place. ``http(s)`` URLs are fetched with a size cap and a
deadline, and by default only from public addresses: a server that fetched any URL a
client names could be pointed at its own network (169.254.169.254, localhost admin
ports). ``file://`` and every other scheme are refused: a client must never read the
server's disk. Every failure is a MediaError whose text says what to change.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import socket
import urllib.parse
from dataclasses import dataclass
from typing import Any

FETCH_MODES = ("off", "public", "all")


class MediaError(ValueError):
    """A media URL the server will not or cannot use (a 400 for the client)."""


@dataclass(frozen=True)
class FetchPolicy:
    """mode: "off" (data: URLs only), "public" (http(s) to public addresses), "all"."""

    mode: str = "public"
    max_bytes: int = 20 * 1024 * 1024
    timeout_s: float = 10.0


@dataclass(frozen=True)
class Media:
    data: bytes
    mime: str  # as declared by the data: URL or the server's Content-Type ("" if none)


def decode_data_url(url: str, max_bytes: int) -> Media:
    """``data:[<mime>][;base64],<payload>`` -> its bytes."""
    header, sep, payload = url[5:].partition(",")
    if not sep:
        raise MediaError("a data: URL needs a ',' before its payload")
    parts = header.split(";")
    if len(payload) > max_bytes * 4 // 3 + 4:
        raise MediaError(f"a data: URL is larger than {max_bytes} bytes")
    if "base64" in parts[1:]:
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise MediaError("a data: URL's base64 payload is not valid base64") from None
    else:
        data = urllib.parse.unquote_to_bytes(payload)
    if len(data) > max_bytes:
        raise MediaError(f"a data: URL is larger than {max_bytes} bytes")
    return Media(data, parts[0].strip().lower())


async def load(url: Any, policy: FetchPolicy) -> Media:
    """The bytes a media URL names, under ``policy``."""
    if not isinstance(url, str) or not url:
        raise MediaError("a media URL must be a non-empty string")
    if url.startswith("data:"):
        return decode_data_url(url, policy.max_bytes)
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in ("http", "https"):
        raise MediaError(f"{scheme or 'scheme-less'} URLs are refused; send a data: URL or "
                         "an http(s) URL")
    if policy.mode == "off":
        raise MediaError("this server does not fetch URLs (--media-fetch off); send the "
                         "media inline as a data: URL")
    try:
        return await asyncio.wait_for(_fetch(url, policy), policy.timeout_s)
    except TimeoutError:
        raise MediaError(f"fetching {url} took longer than {policy.timeout_s:g} s") from None


async def _fetch(url: str, policy: FetchPolicy) -> Media:
    import aiohttp

    host = urllib.parse.urlsplit(url).hostname or ""
    if policy.mode == "public":
        await _check_public(host)
    try:
        async with aiohttp.ClientSession() as session, \
                session.get(url, allow_redirects=False) as resp:
            if resp.status != 200:
                raise MediaError(f"fetching {url} gave HTTP {resp.status}"
                                 + (" (redirects are not followed)" if 300 <= resp.status < 400
                                    else ""))
            if resp.content_length and resp.content_length > policy.max_bytes:
                raise MediaError(f"{url} is larger than {policy.max_bytes} bytes")
            data = bytearray()
            async for chunk in resp.content.iter_chunked(1 << 16):
                data += chunk
                if len(data) > policy.max_bytes:
                    raise MediaError(f"{url} is larger than {policy.max_bytes} bytes")
            return Media(bytes(data), resp.content_type or "")
    except aiohttp.ClientError as e:
        raise MediaError(f"fetching {url} failed: {e}") from None


async def _check_public(host: str) -> None:
    """Refuse hosts that resolve to loopback, private, link-local or reserved addresses.
    (A name could resolve differently when aiohttp connects; this stops the plain cases,
    not DNS rebinding.)"""
    if not host:
        raise MediaError("a media URL needs a host")
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None,
                                                              type=socket.SOCK_STREAM)
    except OSError as e:
        raise MediaError(f"cannot resolve {host}: {e}") from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if not address.is_global:
            raise MediaError(f"{host} resolves to a non-public address ({address}); this "
                             "server fetches only public URLs (--media-fetch all allows it)")
