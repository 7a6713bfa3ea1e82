"""bench sessions, part voice: end of the user's speech -> first audio byte of the answer
on a realtime session of the default assistant (server VAD, greedy), against its critical
path measured stage by stage in the same run, on what the session itself heard and said:
Whisper on the spoken question, SmolLM2 answering the session's transcript to the end of
its first sentence, Piper's first audio of that sentence (bench/assistant.py's helpers).
Each session event is timed as it arrives, from the last speech chunk sent."""

from __future__ import annotations

import asyncio
import base64
import json
import statistics
import time
from typing import Any

import numpy as np

from bench.assistant import QUESTION, SENTENCE_END, _piper, _sse, _whisper
from bench.common import say

RATE = 24_000
CHUNK = RATE * 2 * 20 // 1000  # 20 ms of pcm16


def speech_end(pcm: bytes) -> int:
    """Byte offset just past the last 10 ms frame louder than -40 dBFS."""
    x = np.frombuffer(pcm, dtype="<i2").astype(np.float64) / 32768
    frames = x[: len(x) // 240 * 240].reshape(-1, 240)
    loud = np.flatnonzero(20 * np.log10(np.sqrt((frames ** 2).mean(axis=1)) + 1e-12) > -40)
    return (int(loud[-1]) + 1) * 240 * 2


async def _turn(http: Any, base: str, pcm: bytes, end: int) -> dict[str, Any]:
    """One spoken turn: when each event came (s after the last speech chunk was sent),
    what the server heard and what it said."""
    ws = await http.ws_connect(f"{base}/v1/realtime?model=assistant")
    await ws.receive_json()
    await ws.send_str(json.dumps({"type": "session.update", "session": {
        "type": "realtime", "max_output_tokens": 60, "temperature": 0,
        "audio": {"output": {"voice": "alloy"}}}}))
    await ws.receive_json()
    audio = bytes(RATE * 2 * 3 // 10) + pcm + bytes(RATE * 2 * 10)  # then silence, 10 s
    speech_over = RATE * 2 * 3 // 10 + end
    sent_end: float | None = None
    times: dict[str, float] = {}
    heard = said = ""

    async def mic() -> None:
        nonlocal sent_end
        start = time.monotonic()
        for i, offset in enumerate(range(0, len(audio), CHUNK)):
            if "first_audio" in times:
                return
            await ws.send_str(json.dumps({"type": "input_audio_buffer.append", "audio":
                                          base64.b64encode(audio[offset:offset + CHUNK]).decode()}))
            if sent_end is None and offset + CHUNK >= speech_over:
                sent_end = time.monotonic()
            await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - time.monotonic()))

    sender = asyncio.ensure_future(mic())
    names = {"input_audio_buffer.speech_stopped": "speech_stopped",
             "conversation.item.input_audio_transcription.completed": "transcript",
             "response.created": "response_created",
             "response.output_audio_transcript.delta": "first_text",
             "response.output_audio.delta": "first_audio"}
    while True:
        event = await ws.receive_json(timeout=120)
        now = time.monotonic()
        if event["type"] == "error":
            raise RuntimeError(event["error"])
        if event["type"] in names and names[event["type"]] not in times:
            times[names[event["type"]]] = now
        if event["type"] == "conversation.item.input_audio_transcription.completed":
            heard = event["transcript"]
        if event["type"] == "response.done":
            said = event["response"]["output"][0]["content"][0]["transcript"]
            break
    await sender
    await ws.close()
    return {"after_speech_s": {k: v - sent_end for k, v in times.items()}, "heard": heard,
            "said": said}


async def _llm_alone(http: Any, base: str, question: str) -> tuple[float, str]:
    """SmolLM2 alone answering ``question`` (greedy): seconds to the end of the first
    sentence, and that sentence."""
    start, text, done = time.perf_counter(), "", None
    body = {"model": "smollm2", "stream": True, "temperature": 0, "max_tokens": 60,
            "messages": [{"role": "user", "content": question}]}
    async for event in _sse(http, f"{base}/v1/chat/completions", body):
        text += ((event.get("choices") or [{}])[0].get("delta") or {}).get("content") or ""
        if done is None and SENTENCE_END.search(text):
            done = time.perf_counter() - start
    found = SENTENCE_END.search(text)
    return done or time.perf_counter() - start, text[:found.end()].strip() if found else text


async def measure_voice(base: str, rounds: int) -> dict[str, Any]:
    import aiohttp

    from omni.media.audio import wav_header

    rows = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        async with http.post(f"{base}/v1/audio/speech", json={
                "model": "piper", "voice": "alloy", "input": QUESTION,
                "response_format": "pcm"}) as r:
            pcm = await r.read()
        end = speech_end(pcm)
        wav = wav_header(RATE, end) + pcm[:end]
        await _turn(http, base, pcm, end)  # warm-up, unmeasured
        for i in range(rounds):
            turn = await _turn(http, base, pcm, end)
            llm, sentence = await _llm_alone(http, base, turn["heard"])
            row = {**turn, "whisper_s": await _whisper(http, base, wav), "llm_sentence_s": llm,
                   "sentence": sentence, "piper_s": await _piper(http, base, sentence)}
            rows.append(row)
            say(f"[sessions] voice round {i + 1}: end of speech -> audio "
                f"{turn['after_speech_s']['first_audio'] * 1000:.0f} ms ({turn['heard']!r})")
    return {"rows": rows, "silence_window_ms": 500}


def voice_summary(voice: dict[str, Any]) -> dict[str, float]:
    """Medians (ms) of every measure over the rounds."""
    rows = voice["rows"]
    med = {k: round(statistics.median(r["after_speech_s"].get(k, float("nan")) for r in rows)
                    * 1000, 1) for k in ("speech_stopped", "transcript", "response_created",
                                         "first_text", "first_audio")}
    for key in ("whisper_s", "llm_sentence_s", "piper_s"):
        med[key] = round(statistics.median(r[key] for r in rows) * 1000, 1)
    med["path"] = round(voice["silence_window_ms"] + med["whisper_s"] + med["llm_sentence_s"]
                        + med["piper_s"], 1)
    return med
