"""GET /v1/world on the tiny Cosmos 3: a session opens with a first frame, steps with
actions and gets each chunk as a ``chunk`` event plus one binary message of RGB frames,
resets to the first frame, closes; errors keep the socket; eviction under a small
session budget; 1013 beyond max_sessions; 401 before the upgrade; and AsyncOmni's own
world API on the same server."""

from __future__ import annotations

import asyncio
import base64
import textwrap

import aiohttp
import numpy as np
import pytest
from httputil import ServerSettings, run

from omni.fixtures.tiny_models import ensure_tiny_model
from omni.media.image import encode_image

KEY = "world-key"
HEADERS = {"Authorization": f"Bearer {KEY}"}
FIRST = np.random.RandomState(3).randint(0, 255, (64, 64, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    model_dir = ensure_tiny_model("cosmos3", tmp_path_factory.getbasetemp() / "models")
    # budget: one 64x64 session holds 24 KiB (first + last frame); two do not fit
    pipeline = textwrap.dedent(f"""\
        name: world
        default_modalities: [video]
        sessions: {{max_sessions: 2, state_budget_mb: 0.04}}
        stages:
          - {{name: world, engine: diffusion, model: cosmos3_world, model_dir: {model_dir},
              final_output: video, options: {{default_steps: 3}}}}
        """)
    return start_server({"world": pipeline}, ServerSettings(api_key=KEY, drain_timeout_s=2.0))


def acts(seed: int, width: int = 10) -> list:
    return np.random.RandomState(seed).randn(4, width).round(3).tolist()


async def connect(http):
    return await http.ws_connect("/v1/world?model=world", headers=HEADERS)


async def open_session(ws, image=FIRST, **extra):
    await ws.send_json({"type": "session.open", "prompt": "open the drawer",
                        "domain": "droid_lerobot", "seed": 5,
                        "image": base64.b64encode(encode_image(image)).decode(), **extra})
    return await ws.receive_json(timeout=60)


async def step(ws, seed: int):
    """(chunk event, frames) of one step; progress events in between are checked."""
    await ws.send_json({"type": "step", "actions": acts(seed), "seed": seed})
    progress = 0
    while True:
        event = await ws.receive_json(timeout=60)
        if event["type"] == "step.progress":
            progress += 1
            continue
        assert event["type"] == "chunk", event
        data = await ws.receive_bytes(timeout=60)
        assert len(data) == event["bytes"] and progress == 2  # steps 1, 2 of 3
        shape = (event["frames"], event["height"], event["width"], 3)
        return event, np.frombuffer(data, np.uint8).reshape(shape)


def test_open_three_steps_reset_close(server):
    async def body():
        async with server.session() as http:
            ws = await connect(http)
            created = await open_session(ws)
            assert created["type"] == "session.created" and created["session"]["id"]
            chunks = [await step(ws, k) for k in range(3)]
            assert [c[0]["index"] for c in chunks] == [1, 2, 3]
            assert chunks[0][1].shape == (5, 64, 64, 3)
            assert not np.array_equal(chunks[0][1], chunks[1][1])
            await ws.send_json({"type": "reset"})
            assert (await ws.receive_json(timeout=30))["type"] == "session.reset"
            again = await step(ws, 0)
            assert again[0]["index"] == 1 and np.array_equal(again[1], chunks[0][1])
            await ws.send_json({"type": "close"})
            await ws.receive(timeout=30)
            assert ws.closed
            # a close before any session.open closes too (it got a no_session error)
            early = await connect(http)
            await early.send_json({"type": "close"})
            closed = await early.receive(timeout=30)
            assert closed.type == aiohttp.WSMsgType.CLOSE, closed
            await asyncio.sleep(0.2)
            assert server.inspect(lambda: len(server.models["world"].omni.sessions.manager)) == 0
    run(body())


def test_errors_keep_the_socket(server):
    async def body():
        async with server.session() as http:
            ws = await connect(http)
            await ws.send_json({"type": "step", "actions": acts(1)})
            assert (await ws.receive_json(timeout=30))["error"]["code"] == "no_session"
            await ws.send_str("{not json")
            assert (await ws.receive_json(timeout=30))["type"] == "error"
            bad = await open_session(ws, domain="mars_rover")
            assert "unknown domain" in bad["error"]["message"]
            assert (await open_session(ws))["type"] == "session.created"
            await ws.send_json({"type": "step", "actions": acts(1, width=3)})
            error = await ws.receive_json(timeout=60)
            assert error["type"] == "error" and "width 3" in error["error"]["message"]
            await ws.send_json({"type": "teleport"})
            assert (await ws.receive_json(timeout=30))["error"]["code"] == "unknown_event"
            event, frames = await step(ws, 2)
            assert frames.shape[0] == event["frames"] == 5
            await ws.close()
    run(body())


def test_eviction_capacity_and_auth(server):
    async def body():
        async with server.session() as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await http.ws_connect("/v1/world?model=world")
            assert info.value.status == 401
            first, second = await connect(http), await connect(http)
            await open_session(first)
            await open_session(second)
            await step(first, 1)
            await step(second, 2)  # over the budget: the least recently used (first) goes
            await first.send_json({"type": "step", "actions": acts(3)})
            error = await first.receive_json(timeout=60)
            assert error["type"] == "error" and "evicted" in error["error"]["message"]
            await first.send_json({"type": "reset"})
            await first.receive_json(timeout=30)
            assert (await step(first, 3))[0]["index"] == 1  # from the first frame again
            third = await connect(http)
            refused = await open_session(third)
            assert refused["error"]["code"] == "session_limit_reached"
            closed = await third.receive(timeout=30)
            assert closed.type == aiohttp.WSMsgType.CLOSE and closed.data == 1013
            await first.close()
            await second.close()
    run(body())


def test_async_omni_world_api(server):
    omni = server.models["world"].omni

    async def body():
        session = omni.open_world(FIRST, "open the drawer", "droid_lerobot", steps=3)
        frames = []
        for k in range(2):
            async for out in omni.world_step(session.id, np.asarray(acts(k)), seed=k):
                if out.data and "video" in out.data:
                    frames.append(out.data["video"])
        assert frames[0].shape == (5, 64, 64, 3) and frames[1].shape == (5, 64, 64, 3)
        omni.close_session(session.id)
    server.call(body(), timeout=120)
