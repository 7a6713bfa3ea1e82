"""--api-key: /v1/* needs 'Authorization: Bearer <key>'; /health and /metrics stay open."""

from __future__ import annotations

import asyncio

import openai
import pytest
from httputil import ServerSettings, assert_error_object, run

KEY = "sekrit"


@pytest.fixture(scope="module")
def server(start_server):
    return start_server({"echo": "echo"}, ServerSettings(api_key=KEY, drain_timeout_s=2.0))


def test_right_key_works(server):
    async def body():
        async with server.client(api_key=KEY) as client:
            chat = await client.chat.completions.create(
                model="echo", messages=[{"role": "user", "content": "let me in"}])
            assert chat.choices[0].message.content == "let me in"
            assert [m.id for m in (await client.models.list()).data] == ["echo"]
    run(body())


def test_wrong_key_is_401(server):
    async def body():
        async with server.client(api_key="not-the-key") as client:
            with pytest.raises(openai.AuthenticationError) as info:
                await client.chat.completions.create(
                    model="echo", messages=[{"role": "user", "content": "x"}])
            assert info.value.status_code == 401
            assert info.value.code == "invalid_api_key"
            assert info.value.type == "invalid_request_error"
            with pytest.raises(openai.AuthenticationError):
                await client.models.list()
            with pytest.raises(openai.AuthenticationError):
                await client.completions.create(model="echo", prompt="x")
    run(body())


@pytest.mark.parametrize("headers", [{}, {"Authorization": ""}, {"Authorization": KEY},
                                     {"Authorization": f"Bearer {KEY}x"},
                                     {"Authorization": f"Basic {KEY}"}],
                         ids=["none", "empty", "no-scheme", "longer", "basic"])
def test_missing_or_malformed_key_is_401(server, headers):
    async def body():
        async with server.session() as session:
            for method, path in [("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
                                 ("GET", "/v1/models/echo")]:
                async with session.request(method, path, headers=headers,
                                           json={"model": "echo"}) as resp:
                    assert resp.status == 401, (method, path)
                    assert_error_object(await resp.json(), code="invalid_api_key")
    run(body())


def test_health_and_metrics_are_open(server):
    async def body():
        async with server.session() as session:
            async with session.get("/health") as resp:
                assert resp.status == 200
                assert (await resp.json())["status"] == "ok"
            async with session.get("/metrics") as resp:
                assert resp.status == 200
                assert "omni_stage_replicas_live" in await resp.text()
    run(body())


async def _raw_status(port: int, auth_value: bytes) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        body = b'{"model":"echo","messages":[{"role":"user","content":"x"}]}'
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nConnection: close\r\n"
                     b"Authorization: " + auth_value + b"\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 5.0)
        return int(status_line.split()[1])
    finally:
        writer.close()


def test_non_utf8_key_is_401_not_500(server):
    assert run(_raw_status(server.port, b"Bearer sekri\xff")) == 401


def test_non_ascii_utf8_key_is_401(server):
    assert run(_raw_status(server.port, "Bearer sekrït".encode())) == 401
