"""SIGTERM with WebSocket sessions open: idle ones (a realtime session, an OpenPI robot)
are closed with 1001 (going away) and a reason within a second or two, a robot whose
observation is in flight gets its actions first and then the 1001, a new upgrade during
the drain gets 503 shutting_down, every session is closed, and the server exits 0 without
leaving a /dev/shm block. Before, the sockets stayed open until aiohttp's shutdown cut
them without a close frame, and the server exited ~10 s late."""

from __future__ import annotations

import asyncio
import glob
import re
import signal
import textwrap
import time

import aiohttp
import numpy as np
import pytest
from test_server_e2e import Server

from omni.api.openpi import codec

# a policy slow enough (~2 s a call on a 2-core VM) that SIGTERM surely finds it in flight
ROBOT = """\
    name: robot
    default_modalities: [actions]
    stages:
      - {{name: policy, engine: policy, model: pi0, model_dir: {model_dir},
          final_output: actions, options: {{steps: 1500}}}}
    """
PROMPT_CLOSE_S = 2.0  # from SIGTERM to an idle socket's 1001


def observation() -> dict:
    rng = np.random.default_rng(0)
    return {"observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/state": rng.standard_normal(8), "prompt": "stack the cups"}


async def _robot(http: aiohttp.ClientSession) -> aiohttp.ClientWebSocketResponse:
    ws = await http.ws_connect("/openpi/robot", max_msg_size=0)
    assert (await ws.receive(timeout=30)).type == aiohttp.WSMsgType.BINARY  # metadata
    return ws


async def _realtime(http: aiohttp.ClientSession) -> aiohttp.ClientWebSocketResponse:
    ws = await http.ws_connect("/v1/realtime?model=echo")
    assert (await ws.receive_json(timeout=30))["type"] == "session.created"
    return ws


async def _closed_at(ws: aiohttp.ClientWebSocketResponse) -> tuple[float, int, str]:
    """When the server's close frame came, its code and reason (anything else fails)."""
    message = await ws.receive(timeout=30)
    assert message.type == aiohttp.WSMsgType.CLOSE, message
    return time.monotonic(), message.data, message.extra


async def _sessions_open(http: aiohttp.ClientSession) -> dict[str, float]:
    text = await (await http.get("/metrics")).text()
    return {m[0]: float(m[1]) for m in
            re.findall(r'^omni_sessions_open\{pipeline="(\w+)"\} (\S+)$', text, re.M)}


async def _refused_upgrade(http: aiohttp.ClientSession, path: str) -> int:
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await http.ws_connect(path)
    return refused.value.status


async def _drive(server: Server) -> dict[str, float]:
    async with aiohttp.ClientSession(f"http://127.0.0.1:{server.port}") as http:
        idle_voice, idle_robot, busy_robot = (await _realtime(http), await _robot(http),
                                              await _robot(http))
        assert await _sessions_open(http) == {"echo": 1.0, "robot": 2.0}
        await busy_robot.send_bytes(codec.packb(observation()))
        deadline = time.monotonic() + 30
        while (await (await http.get("/health")).json())["models"]["robot"]["in_flight"] < 1:
            assert time.monotonic() < deadline, "the observation never reached the policy"
            await asyncio.sleep(0.02)
        server.proc.send_signal(signal.SIGTERM)
        sigterm = time.monotonic()
        closes = await asyncio.gather(_closed_at(idle_voice), _closed_at(idle_robot))
        for at, code, reason in closes:
            assert code == 1001 and reason == "server shutting down"
            assert at - sigterm < PROMPT_CLOSE_S
        # the busy robot's call still runs: the drain refuses new sessions meanwhile
        assert await _refused_upgrade(http, "/openpi/robot") == 503
        assert await _refused_upgrade(http, "/v1/realtime?model=echo") == 503
        assert await _sessions_open(http) == {"echo": 0.0, "robot": 1.0}  # closed, not kept
        answer = await busy_robot.receive(timeout=30)
        assert answer.type == aiohttp.WSMsgType.BINARY, answer  # its actions, then the close
        actions = codec.unpackb(answer.data)["actions"]
        assert actions.shape == (50, 7) and np.ptp(actions) > 0
        answered = time.monotonic()
        at, code, reason = await _closed_at(busy_robot)
        assert code == 1001 and reason == "server shutting down"
        return {"idle_close_s": max(c[0] for c in closes) - sigterm,
                "answer_s": answered - sigterm, "busy_close_s": at - answered}


@pytest.mark.timeout(120)
def test_sigterm_closes_websocket_sessions_with_1001_after_their_answer(models, tmp_path):
    robot = tmp_path / "robot.yaml"
    robot.write_text(textwrap.dedent(ROBOT.format(model_dir=models("pi0"))))
    server = Server("--pipeline", "echo", "--pipeline", str(robot), "--no-ui",
                    "--drain-timeout", "30", env={"OMP_NUM_THREADS": "1"})
    try:
        server.wait_listening(timeout=90)
        times = asyncio.run(_drive(server))
        closed = time.monotonic()
        assert server.proc.wait(15) == 0, server.log()
        times["exit_after_last_close_s"] = time.monotonic() - closed
        print(f"\nwebsocket drain: {times}")
    finally:
        server.stop()
    log = server.log()
    assert "leaked" not in log, log
    assert not glob.glob(f"/dev/shm/omni-{server.proc.pid}-*")
    assert times["exit_after_last_close_s"] < 5.0, times
