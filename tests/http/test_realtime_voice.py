"""Voice sessions on the default assistant (Silero VAD -> Whisper -> SmolLM2 -> Piper, real
weights): Piper speaks the question, the test streams it in at real-time pace, the server
finds the turn, answers by voice, and Whisper hears "Paris" in the answer. GA client with
server VAD, beta client committing by hand, and a barge-in on /v1/duplex."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import aiohttp
import pytest
from httputil import ServerSettings, run

from omni.config.presets import preset_path
from omni.media.audio import wav_header
from omni.models.smollm2 import ensure_smollm2

QUESTION = "What is the capital of France? Answer in one sentence."
INTERRUPT = "Stop. Tell me a number between one and ten."
STORY = "Tell me a long story about a brave knight and a dragon."  # a long answer to cut
RATE = 24_000
CHUNK = RATE * 2 * 20 // 1000  # 20 ms of pcm16


@pytest.fixture(scope="module")
def server(start_server):
    model_dir = ensure_smollm2()
    text = preset_path("assistant").read_text().replace(
        "    model: hf_causal\n", f"    model: hf_causal\n    model_dir: {model_dir}\n")
    return start_server({"assistant": text}, ServerSettings(drain_timeout_s=2.0))


@pytest.fixture(scope="module")
def spoken(server):
    """pcm16 at 24 kHz of each sentence, spoken by Piper through the server."""
    async def speak(text: str) -> bytes:
        reply = await server.client(timeout=60.0).audio.speech.create(
            model="piper", voice="alloy", input=text, response_format="pcm")
        return reply.read()

    async def both():
        return {t: await speak(t) for t in (QUESTION, INTERRUPT, STORY)}
    audio = run(both())
    assert all(max(abs(int.from_bytes(a[i:i + 2], "little", signed=True))
                   for i in range(0, len(a), 2)) > 3000 for a in audio.values())  # not silent
    return audio


def hear(server, pcm: bytes) -> str:
    async def call():
        wav = wav_header(RATE, len(pcm)) + pcm
        return (await server.client(timeout=60.0).audio.transcriptions.create(
            model="whisper", file=("a.wav", wav, "audio/wav"))).text
    return run(call())


async def stream_at_pace(send, pcm: bytes, silence_s: float = 0.0) -> None:
    """pcm (then silence) in 20 ms chunks at real-time pace, as a microphone does."""
    audio = pcm + bytes(int(silence_s * RATE) * 2)
    start = time.monotonic()
    for i, offset in enumerate(range(0, len(audio), CHUNK)):
        await send(audio[offset:offset + CHUNK])
        await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - time.monotonic()))


def test_ga_voice_turn_with_server_vad(server, spoken):
    async def body():
        client = server.client(timeout=120.0)
        async with client.realtime.connect(model="assistant") as conn:
            created = await conn.recv()
            assert created.session.audio.input.turn_detection.type == "server_vad"
            # greedy (omni reads "temperature" in GA sessions too): SmolLM2 sampled at the
            # default 0.8 answered "Alsace - Der Führer-Luxembourg's ..." once in a full run
            await conn.session.update(session={"type": "realtime", "max_output_tokens": 60,
                                               "audio": {"output": {"voice": "alloy"}},
                                               "temperature": 0})
            await conn.recv()

            async def send(chunk):
                await conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
            await stream_at_pace(send, bytes(RATE // 2))  # half a second of room noise
            mic = asyncio.ensure_future(stream_at_pace(send, spoken[QUESTION], 1.5))
            kinds, audio, heard = [], [], ""
            while True:
                event = await asyncio.wait_for(conn.recv(), 120)
                kinds.append(event.type)
                if event.type == "response.output_audio.delta":
                    audio.append(base64.b64decode(event.delta))
                elif event.type == "conversation.item.input_audio_transcription.completed":
                    heard = event.transcript
                elif event.type == "response.done":
                    done = event.response
                    break
            await mic
        assert kinds.index("input_audio_buffer.speech_started") \
            < kinds.index("input_audio_buffer.speech_stopped") \
            < kinds.index("input_audio_buffer.committed") < kinds.index("response.created")
        assert "capital of france" in heard.lower()
        assert done.status == "completed", done.status_details
        assert done.usage.output_token_details.audio_tokens > 0
        assert "Paris" in done.output[0].content[0].transcript
        idle = await server.wait_idle("assistant", 10.0)  # the VAD stream ended with the socket
        assert not idle["requests"] and not any(idle["outstanding"].values()), idle
        return b"".join(audio)
    answer = run(body())
    assert "paris" in hear(server, answer).lower()  # Whisper hears it in the spoken answer


def test_beta_voice_turn_committed_by_hand(server, spoken):
    async def body():
        ws_base = server.base_url.replace("http://", "ws://")
        client = server.client(timeout=120.0, websocket_base_url=ws_base)
        async with client.beta.realtime.connect(model="assistant") as conn:
            await conn.recv()
            await conn.session.update(session={"turn_detection": None, "voice": "alloy",
                                               "modalities": ["text", "audio"],
                                               "max_response_output_tokens": 60,
                                               "temperature": 0})  # greedy: see above
            assert (await conn.recv()).session.turn_detection is None
            pcm = spoken[QUESTION]
            for offset in range(0, len(pcm), 48_000):  # as fast as it goes, 1 s pieces
                await conn.input_audio_buffer.append(
                    audio=base64.b64encode(pcm[offset:offset + 48_000]).decode())
            await conn.input_audio_buffer.commit()
            await conn.response.create()
            kinds, done = [], None
            while done is None:
                event = await asyncio.wait_for(conn.recv(), 120)
                kinds.append(event.type)
                done = event.response if event.type == "response.done" else None
        assert "response.audio.delta" in kinds and "response.audio_transcript.delta" in kinds
        assert "response.output_audio.delta" not in kinds
        assert "Paris" in done.output[0].content[0].transcript
    run(body())


def test_duplex_barge_in(server, spoken):
    async def body():
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(f"{server.url}/v1/duplex?model=assistant") as ws:
                assert (await ws.receive_json())["type"] == "session.created"
                await ws.send_str(json.dumps({"type": "session.update", "session": {
                    "instructions": "Answer with a long, detailed story.",
                    "max_output_tokens": 300}}))
                assert (await ws.receive_json())["type"] == "session.updated"
                mic = asyncio.ensure_future(stream_at_pace(ws.send_bytes, spoken[STORY], 1.0))
                log: list[tuple[str, int]] = []  # (event type or "audio", bytes)
                barge = None
                dones = []
                while len(dones) < 2:
                    message = await ws.receive(timeout=120)
                    if message.type == aiohttp.WSMsgType.BINARY:
                        log.append(("audio", len(message.data)))
                        if barge is None and dones == []:  # the answer is playing: speak
                            await mic
                            barge = asyncio.ensure_future(stream_at_pace(
                                ws.send_bytes, spoken[INTERRUPT], 1.5))
                        continue
                    event = json.loads(message.data)
                    assert event["type"] != "error", event
                    log.append((event["type"], 0))
                    if event["type"] == "response.done":
                        dones.append(event["response"])
                await barge
            idle = await server.wait_idle("assistant", 10.0)
            assert not idle["requests"] and not any(idle["outstanding"].values()), idle
        first, second = dones
        assert first["status"] == "cancelled"
        assert first["status_details"]["reason"] == "turn_detected"
        assert second["status"] == "completed"
        kinds = [k for k, _ in log]
        started = [i for i, k in enumerate(kinds) if k == "input_audio_buffer.speech_started"]
        assert len(started) == 2  # the question, then the barge-in
        next_answer = kinds.index("response.created", started[1])
        assert "audio" not in kinds[started[1]:next_answer]  # nothing of the old answer after it
        assert "audio" in kinds[next_answer:]  # the new answer speaks
        said = first["output"][0]["content"][0]["transcript"]
        assert said  # what it had said before the barge-in stays
    run(body())
