"""docs/robots.md's claims the other OpenPI tests leave out, on the tiny π0: a robot that
meets the pipeline at ``max_inflight`` is told "the server is at capacity, retry: ..." and
keeps its connection, and without ``--policy-seed`` every connection draws its own random
seed (call k of a connection: its seed + k)."""

from __future__ import annotations

import asyncio
import textwrap

import aiohttp
import numpy as np
import pytest
from httputil import ServerSettings, run

from omni.api.openpi import codec
from omni.fixtures.tiny_models import ensure_tiny_model


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    model_dir = ensure_tiny_model("pi0", tmp_path_factory.getbasetemp() / "models")
    # one request at a time, and 300 flow-matching steps: a call that another robot can
    # meet while it runs
    pipeline = textwrap.dedent(f"""\
        name: robot
        default_modalities: [actions]
        max_inflight: 1
        stages:
          - {{name: policy, engine: policy, model: pi0, model_dir: {model_dir},
              final_output: actions, options: {{steps: 300}}}}
        """)
    return start_server({"robot": pipeline}, ServerSettings(drain_timeout_s=2.0))


def observation(i: int = 0) -> dict:
    rng = np.random.default_rng(i)
    return {"observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/state": rng.standard_normal(8), "prompt": "stack the cups"}


async def connect(http: aiohttp.ClientSession):
    ws = await http.ws_connect("/", max_msg_size=0)
    assert (await ws.receive(timeout=30)).type == aiohttp.WSMsgType.BINARY  # metadata
    return ws


async def reply(ws):
    message = await ws.receive(timeout=60)
    if message.type == aiohttp.WSMsgType.BINARY:
        return codec.unpackb(message.data)
    assert message.type == aiohttp.WSMsgType.TEXT, message
    return message.data


def test_a_robot_at_capacity_is_told_to_retry_and_keeps_its_connection(server):
    orchestrator = server.models["robot"].omni.orchestrator

    async def body():
        async with server.session() as http:
            first, second = await connect(http), await connect(http)
            await first.send_bytes(codec.packb(observation(1)))
            for _ in range(200):  # the first robot's call is in flight
                if server.inspect(lambda: len(orchestrator.requests)) == 1:
                    break
                await asyncio.sleep(0.01)
            await second.send_bytes(codec.packb(observation(2)))
            refused = await reply(second)
            assert isinstance(refused, str), refused
            assert refused.startswith("the server is at capacity, retry: ")
            assert "in flight" in refused
            assert (await reply(first))["actions"].shape == (50, 7)
            await second.send_bytes(codec.packb(observation(2)))  # the retry is served
            assert (await reply(second))["actions"].shape == (50, 7)
            assert not second.closed
            await first.close()
            await second.close()
    run(body())


def test_without_policy_seed_each_connection_draws_its_own_seed(server):
    async def body():
        async with server.session() as http:
            seeds, chunks = [], []
            for _ in range(2):
                ws = await connect(http)
                calls = []
                for _ in range(2):
                    await ws.send_bytes(codec.packb(observation(3)))
                    calls.append(await reply(ws))
                await ws.close()
                assert calls[1]["seed"] == calls[0]["seed"] + 1  # call k: S + k
                seeds.append(calls[0]["seed"])
                chunks.append(calls[0]["actions"])
        assert seeds[0] != seeds[1]
        assert not np.allclose(chunks[0], chunks[1])  # the same observation, other noise
    run(body())
