"""The default server on a machine loaded several times over its cores (issue 43): while
4x the cores of busy-looping processes (at the server's niceness, bench/cpu_hog.py) run
for 30 s, spoken realtime sessions (server VAD, Whisper, SmolLM2, Piper) and chats go on.
No replica may be declared dead, no session may get an ``error`` event or a failed
transcription, and every turn and chat must be answered. Before the fix a starved
heartbeat thread was taken for a stopped process; a slow-heartbeat warning in the log
now marks each moment the old rule would have declared a replica dead.

Heartbeats come every 0.125 s here instead of 2 s (every other setting is the default),
so that the window holds such moments: on the 2-core VM a 60 s run at 2 s had none (the
old rule would have passed it too), one at 0.25 s had two (asr/0 and vad/0 silent 0.5 s,
both asleep, state S). The window was 60 s at 0.25 s; 30 s at 0.125 s holds as many
heartbeats, a shorter silence already a slow one, for half the CI time. A local replica's
liveness does not depend on the interval any more (its process state decides), so this is
the default's behaviour, seen more often."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
import urllib.request

import pytest
from test_server_e2e import Server, _get

from bench.cpu_hog import CpuHog

HOG_S = 30.0
SESSIONS, CHATS = 2, 2
TURN_TIMEOUT_S = 150.0  # one spoken turn, start to response.done, on the loaded machine
RATE, CHUNK_S = 24_000, 0.1
QUESTION = "What is the capital of France?"


def _speech(server: Server, text: str) -> bytes:
    body = json.dumps({"model": "piper", "voice": "alloy", "input": text,
                       "response_format": "pcm"}).encode()
    request = urllib.request.Request(server.url("/v1/audio/speech"), body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        return resp.read()


async def _turn(ws, audio: bytes, seen: list[dict]) -> dict:
    """Speak ``audio`` at real time (then silence); the turn's response.done."""
    async def mic() -> None:
        step = int(RATE * CHUNK_S) * 2
        for offset in range(0, len(audio), step):
            await ws.send_str(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": base64.b64encode(
                                              audio[offset:offset + step]).decode()}))
            await asyncio.sleep(CHUNK_S)
    sender = asyncio.create_task(mic())
    try:
        while True:
            event = await ws.receive_json(timeout=TURN_TIMEOUT_S)
            seen.append(event)
            if event["type"] == "response.done":
                return event["response"]
    finally:
        sender.cancel()


async def _session(http, base: str, question: bytes, deadline: float, out: dict) -> None:
    async with http.ws_connect(f"{base}/v1/realtime?model=assistant") as ws:
        assert (await ws.receive_json())["type"] == "session.created"
        await ws.send_str(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "max_output_tokens": 24,
            "audio": {"output": {"voice": "alloy"}}}}))
        assert (await ws.receive_json())["type"] == "session.updated"
        audio = bytes(int(RATE * 0.3) * 2) + question + bytes(int(RATE * 1.5) * 2)
        while time.monotonic() < deadline:
            out["turns"] += 1
            response = await _turn(ws, audio, out["events"])
            transcript = "".join(part.get("transcript") or "" for item in response["output"]
                                 for part in item.get("content", []))
            if response["status"] == "completed" and transcript.strip():
                out["answered"] += 1
            else:
                out["unanswered"].append(response)


async def _chats(http, base: str, deadline: float, out: dict) -> None:
    while time.monotonic() < deadline:
        out["chats"] += 1
        async with http.post(f"{base}/v1/chat/completions", json={
                "model": "smollm2", "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": "Say hello."}]}) as resp:
            body = await resp.json()
        if resp.status == 200 and body["choices"][0]["message"]["content"].strip():
            out["chats_answered"] += 1
        else:
            out["unanswered"].append(body)


async def _load(base: str, question: bytes) -> dict:
    import aiohttp

    out = {"turns": 0, "answered": 0, "chats": 0, "chats_answered": 0, "events": [],
           "unanswered": []}
    deadline = time.monotonic() + HOG_S
    timeout = aiohttp.ClientTimeout(total=None, sock_read=TURN_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        await asyncio.gather(*(_session(http, base, question, deadline, out)
                               for _ in range(SESSIONS)),
                             *(_chats(http, base, deadline, out) for _ in range(CHATS)))
    return out


@pytest.mark.timeout(600)
def test_a_machine_loaded_4x_over_its_cores_declares_no_replica_dead() -> None:
    # the built-in default, in the test's session as the hogs are (cpu_hog.py says why)
    server = Server("--heartbeat-s", "0.125")
    try:
        server.wait_listening(timeout=300)
        question = _speech(server, QUESTION)
        started = time.monotonic()
        with CpuHog(4 * (os.cpu_count() or 1), like_pid=server.proc.pid) as hog:
            out = asyncio.run(_load(server.url(""), question))
        took = time.monotonic() - started
        log = server.log()
        deaths = [line for line in log.splitlines() if " is down: " in line]
        slow = [line for line in log.splitlines() if "slow heartbeat: " in line]
        errors = [e for e in out["events"] if e["type"] == "error"
                  or e["type"].endswith("transcription.failed")]
        stages = _get(server.url("/health"))[1]["models"]["assistant"]["stages"]
        print(f"\ncpu hog: {hog.summary()}; {took:.0f} s; turns {out['answered']}/"
              f"{out['turns']} answered, chats {out['chats_answered']}/{out['chats']}; "
              f"deaths {len(deaths)}, error events {len(errors)}, slow-heartbeat warnings "
              f"{len(slow)} (each a death under the old rule): {slow}")
        # the hogs loaded the machine (else nothing here was tested under load)
        assert hog.summary()["loadavg_after"][0] > (os.cpu_count() or 1), hog.summary()
        assert deaths == [], deaths
        assert all(s["restarts"] == 0 and s["live"] == s["replicas"] for s in stages.values())
        assert errors == [], errors
        assert out["unanswered"] == [], out["unanswered"]
        assert out["turns"] >= SESSIONS and out["chats"] >= CHATS
    finally:
        server.stop()
