"""The OpenPI WebSocket on the tiny π0 with a plain aiohttp client speaking openpi's
msgpack-numpy (the unmodified openpi-client runs in tests/openpi/, in its own
environment): metadata first, lockstep, addressing at / and /openpi/{model}, /healthz,
the Api-Key header, seeds, errors that keep the socket, 1009, 1013 beyond max_sessions,
and a killed replica closing with an error frame while a new robot reaches the restart."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import struct
import textwrap

import aiohttp
import numpy as np
import pytest
from httputil import ServerSettings, run

from omni.api.openpi import codec
from omni.fixtures.tiny_models import ensure_tiny_model

KEY = "robot-key"
FRAME_LIMIT = 2 * 1024 * 1024
HEADERS = {"Authorization": f"Api-Key {KEY}"}


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    model_dir = ensure_tiny_model("pi0", tmp_path_factory.getbasetemp() / "models")
    pipeline = textwrap.dedent(f"""\
        name: robot
        default_modalities: [actions]
        sessions: {{max_sessions: 3}}
        stages:
          - {{name: policy, engine: policy, model: pi0, model_dir: {model_dir},
              final_output: actions, restart: true}}
        """)
    return start_server({"robot": pipeline},
                        ServerSettings(api_key=KEY, policy_seed=7, drain_timeout_s=2.0,
                                       max_observation_bytes=FRAME_LIMIT))


def observation(i: int = 0, **extra) -> dict:
    rng = np.random.default_rng(i)
    return {"observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/state": rng.standard_normal(8), "prompt": "stack the cups", **extra}


async def connect(session: aiohttp.ClientSession, path: str = "/"):
    ws = await session.ws_connect(path, headers=HEADERS, max_msg_size=0)
    metadata = await ws.receive(timeout=30)
    assert metadata.type == aiohttp.WSMsgType.BINARY  # the server speaks first, in msgpack
    return ws, codec.unpackb(metadata.data)


async def infer(ws, obs: dict):
    await ws.send_bytes(codec.packb(obs))
    reply = await ws.receive(timeout=30)
    if reply.type == aiohttp.WSMsgType.BINARY:
        return codec.unpackb(reply.data)
    return reply


def test_actions_in_lockstep_with_timing_and_reproducible_seeds(server):
    async def body():
        async with server.session() as http:
            ws, meta = await connect(http)
            assert meta["action_horizon"] == 50 and meta["action_dim"] == 7
            first = await infer(ws, observation())
            second = await infer(ws, observation())
            assert first["actions"].shape == (50, 7) and first["actions"].dtype == np.float32
            assert first["seed"] == 7 and second["seed"] == 8  # --policy-seed 7: call k: 7 + k
            assert "prev_total_ms" in second["server_timing"]
            assert second["episode_step"] == 2
            assert not np.allclose(first["actions"], second["actions"])
            await ws.close()
            # another connection, same path: the same seeds give the same chunks
            ws, _ = await connect(http, "/openpi/robot")
            again = await infer(ws, observation())
            assert np.array_equal(again["actions"], first["actions"])
            pinned = await infer(ws, observation(seed=8))
            assert np.array_equal(pinned["actions"], second["actions"])
            await ws.close()
            health = await http.get("/healthz")
            assert health.status == 200 and await health.text() == "OK\n"
    run(body())


def _without(key: str) -> dict:
    obs = observation()
    del obs[key]
    return obs


# each malformed observation, and the words its refusal must hold (naming the key)
MALFORMED = [
    ({"prompt": "no camera"}, "none of this policy's cameras"),
    ({**observation(), "observation/image": "not an image"},
     "camera 'observation/image' must be an image array"),
    (_without("observation/wrist_image"), "no 'observation/wrist_image'"),
    ({**observation(), "observation/wrist_image": np.zeros((224, 224), np.uint8)},
     "camera 'observation/wrist_image' must be an image array"),
    ({**observation(), "observation/image": np.full((8, 8, 3), 128.0)},
     "camera 'observation/image' is a float frame with values 128..128"),
    ({**observation(), "observation/state": np.zeros(3)},
     "'observation/state' has 3 values; this policy's robot has 8"),
    (_without("observation/state"), "no 'observation/state'"),
    ({**observation(), "observation/left_image": np.zeros((224, 224, 3), np.uint8)},
     "key 'observation/left_image' is not one this policy reads"),
    (observation(seed="seven"), "'seed' must be an integer"),
]


def test_malformed_observations_are_refused_naming_the_key_and_the_robot_goes_on(server):
    async def body():
        async with server.session() as http:
            ws, meta = await connect(http)
            libero = meta["inputs"]["key_styles"]["libero"]
            assert libero["cameras"] == {
                "observation/image": "observation.images.image",
                "observation/wrist_image": "observation.images.wrist_image"}
            assert meta["inputs"]["state_width"] == 8 and meta["state_dim"] == 8
            for bad in (b"\xc1 not msgpack", codec.packb([1, 2])):
                await ws.send_bytes(bad)
                reply = await ws.receive(timeout=30)
                assert reply.type == aiohttp.WSMsgType.TEXT and "bad observation" in reply.data
            for obs, words in MALFORMED:
                await ws.send_bytes(codec.packb(obs))
                reply = await ws.receive(timeout=30)
                assert reply.type == aiohttp.WSMsgType.TEXT, words
                assert reply.data.startswith("bad observation: ") and words in reply.data, (
                    words, reply.data)
            await ws.send_str("hello")
            reply = await ws.receive(timeout=30)
            assert reply.type == aiohttp.WSMsgType.TEXT and "binary" in reply.data
            good = await infer(ws, observation())
            assert good["actions"].shape == (50, 7)
            await ws.close()
    run(body())


def test_auth_addressing_and_frame_limit(server):
    async def body():
        async with server.session() as http:
            for headers in ({}, {"Authorization": "Api-Key wrong"}):
                with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                    await http.ws_connect("/", headers=headers)
                assert info.value.status == 401
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await http.ws_connect("/openpi/nope", headers=HEADERS)
            assert info.value.status == 404
            page = await http.get("/")  # a plain GET / is the playground's, with no key
            assert page.status == 200 and page.content_type == "text/html"
            plain = await http.get("/openpi/robot", headers=HEADERS)
            assert plain.status == 426 and "openpi" in (await plain.json())["error"]["message"]
        assert await oversized_frame_close_code(server.port) == 1009
    run(body())


async def oversized_frame_close_code(port: int) -> int:
    """Opens the robot socket by hand and sends only the header of a binary frame one byte
    over the limit: the server refuses it from the header (aiohttp's reader). Sending the
    whole 2 MiB instead races the server's close against the client's write, and a reset
    may then swallow the close frame (a CI run saw that)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write((f"GET /openpi/robot HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                  "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                  f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                  f"Authorization: Api-Key {KEY}\r\n\r\n").encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    assert head.startswith(b"HTTP/1.1 101"), head
    metadata = await read_frame(reader)
    assert metadata[0] == 0x2  # binary: the server speaks first
    mask = os.urandom(4)  # client frames are masked (RFC 6455 5.3)
    writer.write(struct.pack("!BBQ", 0x82, 0x80 | 127, FRAME_LIMIT + 1) + mask)
    opcode, payload = await read_frame(reader)
    writer.close()
    assert opcode == 0x8, (opcode, payload)  # a close frame
    return struct.unpack("!H", payload[:2])[0]


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One unmasked server frame: (opcode, payload)."""
    first, second = await asyncio.wait_for(reader.readexactly(2), 30)
    length = second & 0x7F
    if length == 126:
        length = struct.unpack("!H", await reader.readexactly(2))[0]
    elif length == 127:
        length = struct.unpack("!Q", await reader.readexactly(8))[0]
    return first & 0x0F, await reader.readexactly(length)


def test_beyond_max_sessions_closes_with_1013(server):
    async def body():
        async with server.session() as http:
            held = [(await connect(http))[0] for _ in range(3)]
            extra = await http.ws_connect("/", headers=HEADERS)
            text = await extra.receive(timeout=30)
            assert text.type == aiohttp.WSMsgType.TEXT and "too many robots" in text.data
            closed = await extra.receive(timeout=30)
            assert closed.type == aiohttp.WSMsgType.CLOSE and closed.data == 1013
            for ws in held:
                await ws.close()
            await asyncio.sleep(0.2)
            assert server.inspect(lambda: len(server.models["robot"].omni.sessions.manager)) == 0
    run(body())


def test_a_killed_replica_sends_an_error_frame_and_a_new_robot_reaches_the_restart(server):
    async def body():
        async with server.session() as http:
            ws, _ = await connect(http)
            await infer(ws, observation())
            replicas = server.inspect(lambda: list(
                server.models["robot"].omni.orchestrator.engines.replicas.values()))
            os.kill(replicas[0].process.pid, signal.SIGKILL)
            await ws.send_bytes(codec.packb(observation()))
            error = await ws.receive(timeout=30)
            assert error.type == aiohttp.WSMsgType.TEXT and "policy failed" in error.data
            closed = await ws.receive(timeout=30)
            assert closed.type == aiohttp.WSMsgType.CLOSE and closed.data in (1011, 1013)
            for _ in range(600):  # the replica restarts (restart: true)
                ws, _ = await http.ws_connect("/", headers=HEADERS), None
                first = await ws.receive(timeout=30)
                if first.type == aiohttp.WSMsgType.BINARY:
                    break
                assert "no live replica" in first.data  # 1013 until it is back
                await ws.receive(timeout=30)
                await asyncio.sleep(0.1)
            reply = await infer(ws, observation())
            assert reply["actions"].shape == (50, 7)
            await ws.close()
    run(body())


def test_async_omni_act_matches_the_socket(server):
    """AsyncOmni.act, the Python path, gives what the socket gives for the same seed."""
    omni = server.models["robot"].omni

    async def direct():
        robot = omni.open_robot()
        try:
            first = await omni.act(observation(), seed=7, session=robot)
            second = await omni.act(observation(), seed=7, session=robot)
        finally:
            omni.close_session(robot.id)
        return first, second
    first, second = server.call(direct(), timeout=60)
    assert first["episode_step"] == 1 and second["episode_step"] == 2
    assert np.array_equal(first["actions"].numpy(), second["actions"].numpy())

    async def socket():
        async with server.session() as http:
            ws, _ = await connect(http)
            reply = await infer(ws, observation(seed=7))
            await ws.close()
            return reply["actions"]
    assert np.array_equal(run(socket()), first["actions"].numpy())
