"""/health turns 503 when a stage loses its only replica (own server: it stays broken)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from httputil import ServerSettings, assert_error_object, run


@pytest.fixture(scope="module")
def server(start_server):
    return start_server({"victim": "echo", "bystander": "echo"},
                        ServerSettings(drain_timeout_s=2.0))


async def _get_health(server) -> tuple[int, dict]:
    async with server.session() as session:
        async with session.get("/health") as resp:
            return resp.status, await resp.json()


def test_health_503_after_replica_sigkill(server):
    async def body():
        status, report = await _get_health(server)
        assert status == 200 and report["status"] == "ok"
        assert report["models"]["victim"]["stages"]["echo"] == {"live": 1, "replicas": 1, "restarts": 0}

        replica = server.models["victim"].omni.orchestrator.engines.replicas["echo/0"]
        os.kill(replica.process.pid, signal.SIGKILL)

        deadline = asyncio.get_running_loop().time() + 3.0
        while True:
            status, report = await _get_health(server)
            if status == 503 or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.05)
        assert status == 503, report
        assert report["status"] == "unavailable"
        victim, bystander = report["models"]["victim"], report["models"]["bystander"]
        assert victim["healthy"] is False
        assert victim["stages"]["echo"] == {"live": 0, "replicas": 1, "restarts": 0}
        assert bystander["healthy"] is True
        assert bystander["stages"]["echo"] == {"live": 1, "replicas": 1, "restarts": 0}

        async with server.session() as session:
            # the dead pipeline refuses with a retryable 503, the other keeps serving
            async with session.post("/v1/chat/completions", json={
                    "model": "victim", "messages": [{"role": "user", "content": "x"}]}) as r:
                assert r.status == 503
                assert r.headers.get("Retry-After")
                assert_error_object(await r.json(), type_="server_error",
                                    code="stage_unavailable")
            async with session.post("/v1/chat/completions", json={
                    "model": "bystander", "messages": [{"role": "user", "content": "y"}]}) as r:
                assert r.status == 200
                assert (await r.json())["choices"][0]["message"]["content"] == "y"
            async with session.get("/metrics") as r:
                text = await r.text()
        assert 'omni_stage_replicas_live{pipeline="victim",stage="echo"} 0.0' in text
        assert 'omni_stage_replicas_live{pipeline="bystander",stage="echo"} 1.0' in text
    run(body())
