"""A realtime session whose server VAD loses its replica (SIGKILL) while audio streams in
(issue 43): the client hears one clear ``error`` event (``replica_died``), never one per
audio chunk about a request "not in flight"; the socket stays open, the VAD listens
again on the restarted replica, and the session still answers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import textwrap

import aiohttp
import pytest
from httputil import run
from voiceutil import b64, events_until, quiet_for, silence

LISTEN = textwrap.dedent("""\
    name: listen
    stages:
      - {name: llm, engine: echo, final_output: text}
      - {name: vad, engine: generation, model: silero_vad, inputs: [audio], restart: true,
         final_output: voice_activity}
    """)


@pytest.fixture(scope="module")
def server(start_server):
    return start_server({"listen": LISTEN})


def _vad(server) -> tuple[int, list[str]]:
    """The VAD replica's pid and the VAD requests in flight."""
    omni = server.models["listen"].omni
    return server.inspect(lambda: (
        omni.orchestrator.engines.replicas["vad/0"].process.pid,
        [r for r in omni.orchestrator.requests if r.startswith("vad-")]))


async def _until(condition, timeout_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.1)


def test_a_dead_vad_replica_is_one_error_and_the_session_goes_on(server):
    async def body():
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"{server.url}/v1/realtime?model=listen")
            created = await ws.receive_json()
            assert created["session"]["audio"]["input"]["turn_detection"]["type"] == \
                "server_vad"
            streaming = asyncio.Event()

            async def mic() -> None:  # 100 ms of silence every 20 ms, as a client streams
                while not streaming.is_set():
                    await ws.send_str(json.dumps({"type": "input_audio_buffer.append",
                                                  "audio": b64(silence(0.1))}))
                    await asyncio.sleep(0.02)
            sender = asyncio.create_task(mic())
            await asyncio.sleep(0.5)
            pid, before = _vad(server)
            assert len(before) == 1
            os.kill(pid, signal.SIGKILL)
            # restarted, and the session's VAD listens on it: a new request in flight
            await _until(lambda: (lambda now: now[0] != pid and now[1] and now[1] != before)(
                _vad(server)), 60)
            await asyncio.sleep(0.5)  # more audio, into the new one
            streaming.set()
            await sender
            events = await quiet_for(ws, 1.0)
            errors = [e["error"] for e in events if e["type"] == "error"]
            assert len(errors) == 1, errors
            # replica_died when the VAD's request was in flight on the killed replica;
            # stage_unavailable when an append reached its socket before the launcher saw
            # the death (stream_edges.send_append; a loaded CI machine, 2026-12-07): either
            # way one error, and the session goes on
            assert errors[0]["code"] in ("replica_died", "stage_unavailable"), errors
            assert errors[0]["type"] == "server_error"
            assert errors[0]["message"].startswith("turn detection stopped: stage 'vad'")
            assert not any("not in flight" in json.dumps(e) for e in events)
            # the session still answers
            await ws.send_str(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "still here"}]}}))
            await ws.send_str(json.dumps({"type": "response.create",
                                          "response": {"output_modalities": ["text"]}}))
            done = (await events_until(ws, "response.done", timeout=30))[-1]
            assert done["response"]["status"] == "completed", done
            assert not ws.closed
            await ws.close()
    run(asyncio.wait_for(body(), 120))
