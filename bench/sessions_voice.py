"""bench sessions, part voice: end of the user's speech -> first audio byte of the answer
on a realtime session of the default assistant (server VAD), against its critical path
measured stage by stage in the same run (bench/assistant.py's helpers)."""

from __future__ import annotations

import asyncio
import base64
import json
import statistics
import time
from typing import Any

import numpy as np

from bench.assistant import QUESTION, _llm, _piper, _whisper
from bench.common import say

RATE = 24_000
CHUNK = RATE * 2 * 20 // 1000  # 20 ms of pcm16


def speech_end(pcm: bytes) -> int:
    """Byte offset just past the last 10 ms frame louder than -40 dBFS."""
    x = np.frombuffer(pcm, dtype="<i2").astype(np.float64) / 32768
    frames = x[: len(x) // 240 * 240].reshape(-1, 240)
    loud = np.flatnonzero(20 * np.log10(np.sqrt((frames ** 2).mean(axis=1)) + 1e-12) > -40)
    return (int(loud[-1]) + 1) * 240 * 2


async def _turn(http: Any, base: str, pcm: bytes, end: int) -> tuple[float, str, str]:
    """(seconds from the last speech chunk sent to the first audio delta, what the server
    heard, the answer's transcript)."""
    ws = await http.ws_connect(f"{base}/v1/realtime?model=assistant")
    await ws.receive_json()
    await ws.send_str(json.dumps({"type": "session.update", "session": {
        "type": "realtime", "max_output_tokens": 60, "audio": {"output": {"voice": "alloy"}}}}))
    await ws.receive_json()
    audio = bytes(RATE * 2 * 3 // 10) + pcm + bytes(RATE * 2 * 10)  # then silence, 10 s
    speech_over = len(audio) - len(pcm) - RATE * 2 * 10 + end
    sent_end, first = None, None
    heard, said = "", ""

    async def mic() -> None:
        nonlocal sent_end
        start = time.monotonic()
        for i, offset in enumerate(range(0, len(audio), CHUNK)):
            if first is not None:
                return
            await ws.send_str(json.dumps({"type": "input_audio_buffer.append", "audio":
                                          base64.b64encode(audio[offset:offset + CHUNK]).decode()}))
            if sent_end is None and offset + CHUNK >= speech_over:
                sent_end = time.monotonic()
            await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - time.monotonic()))

    sender = asyncio.ensure_future(mic())
    while True:
        event = await ws.receive_json(timeout=120)
        if event["type"] == "error":
            raise RuntimeError(event["error"])
        if first is None and event["type"] == "response.output_audio.delta":
            first = time.monotonic()
        if event["type"] == "conversation.item.input_audio_transcription.completed":
            heard = event["transcript"]
        if event["type"] == "response.done":
            said = event["response"]["output"][0]["content"][0]["transcript"]
            break
    await sender
    await ws.close()
    return first - sent_end, heard, said


async def measure_voice(base: str, rounds: int) -> dict[str, Any]:
    import aiohttp

    out: dict[str, list[float]] = {k: [] for k in ("speech_end_to_audio", "whisper",
                                                   "llm_sentence", "piper")}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        async with http.post(f"{base}/v1/audio/speech", json={
                "model": "piper", "voice": "alloy", "input": QUESTION,
                "response_format": "pcm"}) as r:
            pcm = await r.read()
        end = speech_end(pcm)
        from omni.media.audio import wav_header
        wav = wav_header(RATE, len(pcm)) + pcm
        await _turn(http, base, pcm, end)  # warm-up, unmeasured
        for i in range(rounds):
            latency, heard, said = await _turn(http, base, pcm, end)
            out["speech_end_to_audio"].append(latency)
            out["whisper"].append(await _whisper(http, base, wav))
            _, sentence_end, sentence = await _llm(http, base)
            out["llm_sentence"].append(sentence_end)
            out["piper"].append(await _piper(http, base, sentence))
            say(f"[sessions] voice round {i + 1}: end of speech -> audio {latency * 1000:.0f} ms")
    p50 = {k: round(statistics.median(v) * 1000, 1) for k, v in out.items()}
    p50["silence_window"] = 500.0  # turn_detection.silence_duration_ms, the default
    return {"samples_s": out, "p50_ms": p50, "transcript": heard, "answer": said}
