"""Server-VAD turns on GET /v1/realtime with the small voice pipeline (voiceutil.py: Silero
VAD, Whisper, the tiny Qwen3): turn_detection's threshold, prefix_padding_ms and
silence_duration_ms reach the VAD, create_response and interrupt_response do what they
say, and speech during an answer interrupts it (barge-in) on /v1/realtime itself."""

from __future__ import annotations

import json

import aiohttp
from httputil import run
from voiceutil import (
    QUESTION,
    STORY,
    b64,
    events_until,
    quiet_for,
    silence,
    update,
)

HELLO = {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "Tell me about the sea."}]}


def vad(**settings) -> dict:
    """A GA session.update: text answers, server VAD with these settings."""
    return {"type": "realtime", "output_modalities": ["text"],
            "audio": {"input": {"turn_detection": {"type": "server_vad", **settings}}}}


async def listening(http, server, **settings):
    ws = await http.ws_connect(f"{server.url}/v1/realtime?model=voice")
    assert (await ws.receive_json())["type"] == "session.created"
    updated = await update(ws, vad(**settings))
    assert updated["type"] == "session.updated", updated
    return ws


async def append(ws, pcm: bytes) -> None:
    for offset in range(0, len(pcm), 48_000):  # 1 s pieces, as fast as they go
        await ws.send_str(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": b64(pcm[offset:offset + 48_000])}))


def of(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == f"input_audio_buffer.{kind}"]


def test_prefix_padding_ms_reaches_the_vad(voice_server, speech):
    async def start_ms(http, padding: int) -> int:
        ws = await listening(http, voice_server, prefix_padding_ms=padding,
                             create_response=False)
        await append(ws, silence(1.5) + speech[QUESTION] + silence(1.0))
        started = of(await events_until(ws, "input_audio_buffer.speech_stopped"),
                     "speech_started")
        await ws.close()
        return started[0]["audio_start_ms"]

    async def body():
        async with aiohttp.ClientSession() as http:
            none, some = await start_ms(http, 0), await start_ms(http, 700)
        assert 1400 <= none <= 1700  # the speech starts after 1.5 s of silence
        assert abs((none - some) - 700) <= 1, (none, some)
    run(body())


def test_silence_duration_ms_reaches_the_vad(voice_server, speech):
    gap_s = 0.8
    second_at = int((1.0 + len(speech[QUESTION]) / 48_000 + gap_s) * 1000)
    audio = silence(1.0) + speech[QUESTION] + silence(gap_s) + speech[QUESTION] + silence(2.5)

    async def turns(http, silence_ms: int) -> list[dict]:
        ws = await listening(http, voice_server, silence_duration_ms=silence_ms,
                             create_response=False)
        await append(ws, audio)
        events = await events_until(ws, "input_audio_buffer.speech_stopped")
        if events[-1]["audio_end_ms"] < second_at:  # a turn ended in the gap: the second
            events += await events_until(ws, "input_audio_buffer.speech_stopped")
        await ws.close()
        return events

    async def body():
        async with aiohttp.ClientSession() as http:
            short, long = await turns(http, 300), await turns(http, 1500)
        assert len(of(short, "speech_started")) == 2  # the 0.8 s gap ended the first turn
        assert of(short, "speech_stopped")[0]["audio_end_ms"] < second_at
        assert len(of(long, "speech_started")) == 1  # the gap was shorter than 1.5 s
        assert of(long, "speech_stopped")[0]["audio_end_ms"] > second_at
    run(body())


def test_threshold_reaches_the_vad(voice_server, speech):
    audio = silence(0.5) + speech[QUESTION] + silence(1.0)

    async def body():
        async with aiohttp.ClientSession() as http:
            # Silero's probability never reaches 1.0 (0.99998 at most on this speech)
            ws = await listening(http, voice_server, threshold=1.0, create_response=False)
            await append(ws, audio)
            heard = [e["type"] for e in await quiet_for(ws, 3.0)]
            assert "input_audio_buffer.speech_started" not in heard, heard
            # the same socket and audio with the default threshold: a turn, at once
            assert (await update(ws, vad(create_response=False)))["type"] == "session.updated"
            await append(ws, audio)
            events = await events_until(ws, "input_audio_buffer.committed", timeout=3.0)
            assert of(events, "speech_started")
            await ws.close()
    run(body())


def test_create_response_false_commits_without_answering(voice_server, speech):
    async def body():
        async with aiohttp.ClientSession() as http:
            ws = await listening(http, voice_server, create_response=False)
            await update(ws, {"max_output_tokens": 4})
            await append(ws, silence(0.5) + speech[QUESTION] + silence(1.0))
            await events_until(ws, "input_audio_buffer.committed")
            # had the server answered on its own, this would be refused (one at a time)
            await ws.send_str(json.dumps({"type": "response.create"}))
            events = await events_until(ws, "response.done")
            assert [e for e in events if e["type"] == "error"] == []
            assert len([e for e in events if e["type"] == "response.created"]) == 1
            assert events[-1]["response"]["status"] == "completed"
            assert [e["type"] for e in await quiet_for(ws, 1.0)
                    if e["type"].startswith("response.")] == []
            await ws.close()
            # and with create_response (the default), the turn is answered unasked
            ws = await listening(http, voice_server)
            await update(ws, {"max_output_tokens": 4})
            await append(ws, silence(0.5) + speech[QUESTION] + silence(1.0))
            events = await events_until(ws, "response.done")
            assert events[-1]["response"]["status"] == "completed"
            kinds = [e["type"] for e in events]
            assert kinds.index("input_audio_buffer.committed") < kinds.index("response.created")
            await ws.close()
    run(body())


async def answering(ws, max_tokens: int | str = "inf") -> None:
    """A text answer of the tiny Qwen3 (4,000 tokens unless limited, ~6 s), running."""
    await ws.send_str(json.dumps({"type": "conversation.item.create", "item": HELLO}))
    await ws.send_str(json.dumps({"type": "response.create",
                                  "response": {"max_output_tokens": max_tokens}}))
    await events_until(ws, "response.output_text.delta")


def test_barge_in_on_realtime_interrupts_the_answer(voice_server, speech):
    async def body():
        async with aiohttp.ClientSession() as http:
            ws = await listening(http, voice_server)  # interrupt_response, create_response
            await answering(ws)
            await update(ws, {"max_output_tokens": 4})  # for the next answer
            await append(ws, silence(0.3) + speech[STORY] + silence(1.0))
            events = await events_until(ws, "response.done")
            kinds = [e["type"] for e in events]
            assert "input_audio_buffer.speech_started" in kinds
            first = events[-1]["response"]
            assert first["status"] == "cancelled", first.get("status_details")
            assert first["status_details"]["reason"] == "turn_detected"
            assert first["output"][0]["content"][0]["text"]  # what it had said stays
            assert first["usage"]["output_tokens"] < 4000
            # the user's turn is committed, heard and answered (the audio went in at once:
            # its commit may come before the cancelled answer's response.done)
            second = await events_until(ws, "response.done")
            kinds = [e["type"] for e in second]
            assert "input_audio_buffer.committed" in [e["type"] for e in events + second]
            assert "response.created" in kinds
            heard = [e for e in events + second if e["type"]
                     == "conversation.item.input_audio_transcription.completed"]
            assert "long story" in heard[0]["transcript"].lower()
            assert second[-1]["response"]["status"] == "completed"
            await ws.close()
    run(body())


def test_interrupt_response_false_lets_the_answer_finish(voice_server, speech):
    async def body():
        async with aiohttp.ClientSession() as http:
            ws = await listening(http, voice_server, interrupt_response=False,
                                 create_response=False)
            await answering(ws, 2000)  # ~3 s
            await append(ws, silence(0.3) + speech[STORY] + silence(1.0))
            events = await events_until(ws, "response.done")
            kinds = [e["type"] for e in events]
            assert "input_audio_buffer.speech_started" in kinds  # heard during the answer
            done = events[-1]["response"]
            assert done["status"] == "completed" and done["usage"]["output_tokens"] == 2000
            await ws.close()
    run(body())
