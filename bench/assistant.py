"""The default's spoken assistant: time to first audio, asked by text and by voice, against
its critical path measured stage by stage in the same run.

`python -m omni.server` (no flags) is started as a subprocess; one request at a time:

  ttfa text   POST /v1/chat/completions, model assistant, stream, modalities text+audio
              (pcm16): the question as text; time to the first delta carrying audio data
  ttfa voice  the same with the question as an input_audio part (Piper spoke it, WAV)
  whisper     POST /v1/audio/transcriptions of that WAV, model whisper: time to the reply
  llm         streaming chat to smollm2 (the same question, greedy): time to the first
              token (TTFT) and to the end of the first sentence of the answer
  piper       POST /v1/audio/speech of that first sentence, model piper, stream_format
              audio (pcm): time to the first audio byte

Critical path (text) = llm to the first sentence's end + piper's first audio of it;
(voice) = whisper + that. Target: TTFA <= critical path + 50 ms. Medians over --rounds.
Writes assistant.md and assistant.json.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any

from bench.common import hardware, say

DESCRIPTION = __doc__
QUESTION = "What is the capital of France? Answer in one sentence."
SENTENCE_END = re.compile(r"[.!?](\s|$)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=5, help="requests per measure (default 5)")
    parser.add_argument("--out", default="bench/results", help="report directory")


async def _sse(session: Any, url: str, body: dict[str, Any]) -> Any:
    async with session.post(url, json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"{url}: {r.status} {await r.text()}")
        async for line in r.content:
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                yield json.loads(line[6:])


async def _ttfa(session: Any, base: str, content: Any) -> float:
    start = time.perf_counter()
    body = {"model": "assistant", "stream": True, "temperature": 0, "max_tokens": 60,
            "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"},
            "messages": [{"role": "user", "content": content}]}
    first = None
    async for event in _sse(session, f"{base}/v1/chat/completions", body):
        delta = (event.get("choices") or [{}])[0].get("delta") or {}
        if first is None and (delta.get("audio") or {}).get("data"):
            first = time.perf_counter() - start
    if first is None:
        raise RuntimeError("the assistant's answer held no audio")
    return first


async def _llm(session: Any, base: str) -> tuple[float, float, str]:
    start, ttft, text, sentence_end = time.perf_counter(), None, "", None
    body = {"model": "smollm2", "stream": True, "temperature": 0, "max_tokens": 60,
            "messages": [{"role": "user", "content": QUESTION}]}
    async for event in _sse(session, f"{base}/v1/chat/completions", body):
        piece = ((event.get("choices") or [{}])[0].get("delta") or {}).get("content") or ""
        if piece and ttft is None:
            ttft = time.perf_counter() - start
        text += piece
        if sentence_end is None and SENTENCE_END.search(text):
            sentence_end = time.perf_counter() - start
    first = text[:SENTENCE_END.search(text).end()].strip() if SENTENCE_END.search(text) else text
    return ttft or 0.0, sentence_end or time.perf_counter() - start, first


async def _piper(session: Any, base: str, sentence: str) -> float:
    start = time.perf_counter()
    body = {"model": "piper", "voice": "alloy", "input": sentence, "response_format": "pcm",
            "stream_format": "audio"}
    async with session.post(f"{base}/v1/audio/speech", json=body) as r:
        async for chunk in r.content.iter_any():
            if chunk:
                return time.perf_counter() - start
    raise RuntimeError("no speech")


async def _whisper(session: Any, base: str, wav: bytes) -> float:
    import aiohttp

    form = aiohttp.FormData()
    form.add_field("model", "whisper")
    form.add_field("file", wav, filename="q.wav", content_type="audio/wav")
    start = time.perf_counter()
    async with session.post(f"{base}/v1/audio/transcriptions", data=form) as r:
        await r.read()
    return time.perf_counter() - start


async def _measure(base: str, rounds: int) -> dict[str, Any]:
    import aiohttp

    out: dict[str, list[float]] = {k: [] for k in (
        "ttfa_text", "ttfa_voice", "whisper", "llm_ttft", "llm_sentence", "piper")}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        async with session.post(f"{base}/v1/audio/speech", json={
                "model": "piper", "voice": "alloy", "input": QUESTION,
                "response_format": "wav"}) as r:
            wav = await r.read()
        voice = [{"type": "input_audio", "input_audio": {
            "data": base64.b64encode(wav).decode(), "format": "wav"}}]
        _, _, sentence = await _llm(session, base)  # warm-up, unmeasured
        await _ttfa(session, base, voice)
        for _ in range(rounds):
            out["ttfa_text"].append(await _ttfa(session, base, QUESTION))
            out["ttfa_voice"].append(await _ttfa(session, base, voice))
            out["whisper"].append(await _whisper(session, base, wav))
            ttft, end, sentence = await _llm(session, base)
            out["llm_ttft"].append(ttft)
            out["llm_sentence"].append(end)
            out["piper"].append(await _piper(session, base, sentence))
    medians = {k: round(statistics.median(v) * 1000, 1) for k, v in out.items()}
    return {"samples_s": out, "p50_ms": medians, "first_sentence": sentence}


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from bench.tts import start_server

    say("[assistant] starting python -m omni.server (the default)")
    proc, base = start_server(None)
    try:
        result = asyncio.run(_measure(base, args.rounds))
    finally:
        proc.terminate()
        proc.wait(60)
    result.update(command="python -m bench " + " ".join(argv), hardware=hardware(),
                  rounds=args.rounds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "assistant.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "assistant.md").write_text(_report(result))
    say(f"[assistant] wrote {out / 'assistant.md'}")
    return 0


def _report(r: dict[str, Any]) -> str:
    m, hw = r["p50_ms"], r["hardware"]
    text_path = m["llm_sentence"] + m["piper"]
    voice_path = m["whisper"] + text_path
    rows = [("asked by text", m["ttfa_text"], text_path),
            ("asked by voice", m["ttfa_voice"], voice_path)]
    lines = [
        "# The default assistant: time to first audio vs its critical path", "",
        f"Command: `{r['command']}`  ",
        f"Machine: {hw['cpu_model']}, {hw['cores']} cores, Python {hw['python']}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}; {r['rounds']} rounds, medians", "",
        DESCRIPTION.split("\n\n", 1)[1].strip(), "",
        f"Question: \"{QUESTION}\"; the answer's first sentence: \"{r['first_sentence']}\"", "",
        "| stage alone | p50 ms |", "|---|---:|",
        f"| whisper: transcribe the spoken question | {m['whisper']} |",
        f"| smollm2: first token | {m['llm_ttft']} |",
        f"| smollm2: end of the first sentence | {m['llm_sentence']} |",
        f"| piper: first audio of that sentence | {m['piper']} |", "",
        "| assistant | TTFA p50 ms | critical path ms | TTFA - path | target (<= +50 ms) |",
        "|---|---:|---:|---:|---|",
        *(f"| {name} | {ttfa} | {path:.1f} | {ttfa - path:+.1f} | "
          f"{'met' if ttfa <= path + 50 else '**missed**'} |" for name, ttfa, path in rows), ""]
    return "\n".join(lines)
