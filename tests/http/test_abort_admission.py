"""Admission (429 + retry-after) and client disconnects aborting requests everywhere."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import openai
import pytest
from httputil import assert_error_object, run

CHAT = "/v1/chat/completions"


def _aborted(server, pipeline: str) -> float:
    value = server.metrics.registry.get_sample_value(
        "omni_requests_total", {"pipeline": pipeline, "outcome": "RequestAbortedError"})
    return value or 0.0


async def _wait_in_flight(server, model: str, n: int, timeout_s: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while len(server.in_flight(model)["requests"]) < n:
        assert asyncio.get_running_loop().time() < deadline, f"{model}: never {n} in flight"
        await asyncio.sleep(0.02)


def test_admission_limit_gives_429_with_retry_after(main_server):
    """'single' admits one request at a time (max_inflight: 1); each takes about 1 s."""
    messages = [{"role": "user", "content": "one at a time"}]

    async def body():
        async with main_server.session() as session:
            async def post() -> tuple[int, dict, dict]:
                async with session.post(CHAT, json={"model": "single",
                                                    "messages": messages}) as resp:
                    return resp.status, dict(resp.headers), await resp.json()

            first = asyncio.create_task(post())
            await _wait_in_flight(main_server, "single", 1)
            status, headers, err = await post()
            assert status == 429
            retry_after = headers.get("Retry-After") or headers.get("retry-after")
            assert retry_after is not None and float(retry_after) >= 0
            assert_error_object(err, type_="rate_limit_error")
            # the SDK (retries off) sees a RateLimitError
            async with main_server.client() as client:
                with pytest.raises(openai.RateLimitError):
                    await client.chat.completions.create(model="single", messages=messages)
            # the admitted request is unaffected
            status, _, ok = await first
            assert status == 200 and ok["choices"][0]["message"]["content"] == "one at a time"
            # and its slot is free again
            status, _, ok = await post()
            assert status == 200
    run(body())
    assert main_server.in_flight("single")["requests"] == []


def test_stream_disconnect_aborts_request(main_server):
    """Read one chunk of a 4 s stream, drop the connection: the server aborts at once."""
    before = _aborted(main_server, "slow")

    async def body():
        session = main_server.session()
        try:
            resp = await session.post(CHAT, json={
                "model": "slow", "stream": True,
                "messages": [{"role": "user", "content": "x" * 40}]})
            assert resp.status == 200
            while True:  # up to the first content delta
                line = await asyncio.wait_for(resp.content.readline(), 5.0)
                if line.startswith(b"data:") and b'"content": "x' in line:
                    break
            state = main_server.in_flight("slow")
            assert len(state["requests"]) == 1 and any(state["outstanding"].values()), state
            resp.close()  # drops the connection
        finally:
            await session.close()
        state = await main_server.wait_idle("slow", 2.0)
        assert state["requests"] == [], state
        assert not any(state["outstanding"].values()), state
    run(body())
    assert _aborted(main_server, "slow") == before + 1


def test_non_stream_client_timeout_aborts_request(main_server):
    """A non-stream request the client gives up on (aiohttp timeout) is aborted too:
    the server runs handlers with handler_cancellation=True."""
    before = _aborted(main_server, "slow")

    async def body():
        async with main_server.session(timeout=aiohttp.ClientTimeout(total=0.6)) as session:
            with pytest.raises(asyncio.TimeoutError):
                async with session.post(CHAT, json={
                        "model": "slow", "messages": [{"role": "user", "content": "y" * 40}]}
                        ) as resp:
                    await resp.read()
        # it would take 4 s to finish by itself; the abort must come well before that
        state = await main_server.wait_idle("slow", 2.0)
        assert state["requests"] == [], state
        assert not any(state["outstanding"].values()), state
    run(body())
    assert _aborted(main_server, "slow") == before + 1


def test_sdk_stream_close_aborts_request(main_server):
    """The SDK's own stream.close() (e.g. leaving `async with`) aborts the request."""
    async def body():
        async with main_server.client() as client:
            stream = await client.chat.completions.create(
                model="slow", messages=[{"role": "user", "content": "z" * 40}], stream=True)
            async with stream:
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        break
        state = await main_server.wait_idle("slow", 2.0)
        assert state["requests"] == [] and not any(state["outstanding"].values()), state
    run(body())


def test_stream_disconnect_is_not_logged_as_server_error(main_server, caplog):
    caplog.set_level(logging.ERROR, logger="omni")

    async def body():
        session = main_server.session()
        try:
            resp = await session.post(CHAT, json={
                "model": "slow", "stream": True,
                "messages": [{"role": "user", "content": "w" * 40}]})
            while True:
                line = await asyncio.wait_for(resp.content.readline(), 5.0)
                if line.startswith(b"data:") and b'"content": "w' in line:
                    break
            resp.close()
        finally:
            await session.close()
        await main_server.wait_idle("slow", 2.0)
        await asyncio.sleep(0.2)  # let the handler finish unwinding
    run(body())
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR
              and r.name.startswith("omni.api")]
    assert errors == [], [r.getMessage() for r in errors]
