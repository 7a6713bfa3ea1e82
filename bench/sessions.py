"""Sessions over realtime WebSockets, measured the way clients use them: `python -m
omni.server` as a subprocess, raw WebSocket clients (aiohttp), one run, three parts.

  history  SmolLM2 (the default server's `smollm2` id), text turns, greedy: a session holds
           8 turns of history; its 9th turn's TTFT (response.create sent -> first text
           delta) against a plain streaming chat request (POST /v1/chat/completions)
           carrying the same conversation whose prefix the server has never seen (each
           conversation opens with its own id, so the prefix cache is cold). Target: the
           session's turn >= 3x faster.
  many     64 concurrent realtime sessions on one replica of the tiny Qwen3 (a server
           started with --pipeline, sessions.max_sessions 64, the default state budget):
           all served (2 turns each); engine KV bytes per idle session and the server
           process tree's RSS per idle session; evictions (target: none).
  voice    the default assistant with server VAD: Piper speaks the question, streamed in
           20 ms chunks at real-time pace followed by silence; end of the user's speech
           (the last speech sample sent) -> first audio byte of the answer, against the
           VAD's silence window + each stage alone (whisper on the clip, smollm2 to the end
           of its first sentence, piper's first audio of that sentence) + 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import hardware, say

DESCRIPTION = __doc__
QUESTIONS = ["Tell me about the sea.", "What lives in it?", "Which fish is the biggest?",
             "How deep is the ocean?", "Why is the sea salty?", "What are tides?",
             "Name a famous sea explorer.", "What is a coral reef?"]
NEXT = "Summarize our talk in one sentence."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parts", default="history,many,voice",
                        help="which parts to run (default history,many,voice)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of history/voice")
    parser.add_argument("--sessions", type=int, default=64, help="sessions of part many")
    parser.add_argument("--out", default="bench/results", help="report directory")


# -- helpers ---------------------------------------------------------------------------------
async def until(ws: Any, kind: str) -> list[dict[str, Any]]:
    seen = []
    while True:
        event = await ws.receive_json(timeout=300)
        seen.append(event)
        if event["type"] == "error":
            raise RuntimeError(f"error event: {event['error']}")
        if event["type"] == kind:
            return seen


async def send(ws: Any, kind: str, **fields: Any) -> None:
    await ws.send_str(json.dumps({"type": kind, **fields}))


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": text}]}


async def text_session(http: Any, base: str, model: str, instructions: str,
                       max_tokens: int) -> Any:
    ws = await http.ws_connect(f"{base}/v1/realtime?model={model}")
    await until(ws, "session.created")
    await send(ws, "session.update", session={
        "type": "realtime", "output_modalities": ["text"], "instructions": instructions,
        "max_output_tokens": max_tokens, "turn_detection": None})
    await until(ws, "session.updated")
    return ws


async def turn(ws: Any, text: str) -> tuple[float, dict[str, Any]]:
    """(seconds from response.create to the first text delta, the response)."""
    await send(ws, "conversation.item.create", item=user(text))
    await until(ws, "conversation.item.added")
    start = time.perf_counter()
    await send(ws, "response.create")
    first = None
    while True:  # each event timed as it arrives
        event = await ws.receive_json(timeout=300)
        if event["type"] == "error":
            raise RuntimeError(f"error event: {event['error']}")
        if first is None and event["type"] == "response.output_text.delta":
            first = time.perf_counter() - start
        if event["type"] == "response.done":
            return first or float("nan"), event["response"]


# -- part history ----------------------------------------------------------------------------
async def _history(base: str, rounds: int) -> dict[str, Any]:
    import aiohttp

    rows = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        for r in range(rounds + 1):  # round 0 warms up, unmeasured
            label = f"Conversation {uuid.uuid4().hex[:12]}. Answer briefly."
            ws = await text_session(http, base, "smollm2", label, 40)
            history = [{"role": "system", "content": label}]
            for question in QUESTIONS:
                _, done = await turn(ws, question)
                history += [{"role": "user", "content": question},
                            {"role": "assistant", "content": done["output"][0]["content"][0]["text"]}]
            session_ttft, done = await turn(ws, NEXT)
            await ws.close()
            cold = [{"role": "system", "content": f"Conversation {uuid.uuid4().hex[:12]}. "
                     "Answer briefly."}] + history[1:] + [{"role": "user", "content": NEXT}]
            plain_ttft = await _plain_ttft(http, base, cold)
            if r:
                usage = done["usage"]
                rows.append({"session_ttft_s": session_ttft, "plain_ttft_s": plain_ttft,
                             "prompt_tokens": usage["input_tokens"],
                             "cached_tokens": usage["input_token_details"]["cached_tokens"]})
                say(f"[sessions] history round {r}: session {session_ttft * 1000:.0f} ms, "
                    f"plain {plain_ttft * 1000:.0f} ms, prompt {usage['input_tokens']} tokens")
    return {"rows": rows}


async def _plain_ttft(http: Any, base: str, messages: list[dict[str, Any]]) -> float:
    body = {"model": "smollm2", "stream": True, "temperature": 0, "max_tokens": 40,
            "messages": messages}
    start, first = time.perf_counter(), None
    async with http.post(f"{base}/v1/chat/completions", json=body) as r:
        async for line in r.content:
            if first is None and line.startswith(b"data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                if (choices[0].get("delta") or {}).get("content"):
                    first = time.perf_counter() - start
    return first or float("nan")


# -- part many -------------------------------------------------------------------------------
def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all of its descendants (from /proc)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


async def _metrics(http: Any, base: str) -> dict[str, float]:
    async with http.get(f"{base}/metrics") as r:
        text = await r.text()
    out = {}
    for line in text.splitlines():
        for name in ("omni_sessions_open", "omni_session_state_bytes",
                     "omni_session_evictions_total", "omni_session_state_budget_bytes"):
            if line.startswith(name + "{"):
                out[name] = float(line.rsplit(" ", 1)[1])
    return out


async def _many(base: str, pid: int, n: int) -> dict[str, Any]:
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        rss_before = tree_rss(pid)
        start = time.perf_counter()

        async def one(i: int) -> tuple[Any, int]:
            ws = await text_session(http, base, "tiny", f"Session {i}.", 8)
            done = 0
            for question in QUESTIONS[:2]:
                _, response = await turn(ws, question)
                done += response["status"] == "completed"
            return ws, done

        opened = await asyncio.gather(*(one(i) for i in range(n)))
        elapsed = time.perf_counter() - start
        await asyncio.sleep(1.0)  # the engines' last byte reports
        rss_idle = tree_rss(pid)
        metrics = await _metrics(http, base)
        for ws, _ in opened:
            await ws.close()
    return {"sessions": n, "served": sum(d == 2 for _, d in opened), "elapsed_s": elapsed,
            "rss_before": rss_before, "rss_idle": rss_idle, "metrics": metrics}


# -- running ---------------------------------------------------------------------------------
def run(args: argparse.Namespace, argv: list[str]) -> int:
    from bench.tts import start_server

    parts = set(args.parts.split(","))
    result: dict[str, Any] = {"command": "python -m bench " + " ".join(argv),
                              "hardware": hardware()}
    if parts & {"history", "voice"}:
        say("[sessions] starting python -m omni.server (the default)")
        proc, base = start_server(None)
        try:
            if "history" in parts:
                result["history"] = asyncio.run(_history(base, args.rounds))
            if "voice" in parts:
                from bench.sessions_voice import measure_voice
                result["voice"] = asyncio.run(measure_voice(base, args.rounds))
        finally:
            proc.terminate()
            proc.wait(60)
    if "many" in parts:
        result["many"] = _run_many(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sessions.json").write_text(json.dumps(result, indent=1) + "\n")
    from bench.sessions_report import report
    (out / "sessions.md").write_text(report(result, DESCRIPTION))
    say(f"[sessions] wrote {out / 'sessions.md'}")
    return 0


def _run_many(args: argparse.Namespace) -> dict[str, Any]:
    import tempfile

    from bench.tts import start_server
    from omni.fixtures import build_tiny_qwen3

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_qwen3(Path(tmp) / "qwen3", initializer_range=0.5)
        pipeline = Path(tmp) / "tiny.yaml"
        pipeline.write_text(
            f"name: tiny\nsessions: {{max_sessions: {args.sessions}}}\nstages:\n"
            f"  - {{name: llm, engine: ar, model_dir: {model}, final_output: text,\n"
            "     params: {temperature: 0}}\n")
        say(f"[sessions] starting python -m omni.server --pipeline tiny ({args.sessions} sessions)")
        proc, base = start_server(str(pipeline), "tiny")
        try:
            return asyncio.run(_many(base, proc.pid, args.sessions))
        finally:
            proc.terminate()
            proc.wait(60)


def median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 1)
