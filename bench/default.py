"""Good answers by default: the default server's answers to factual questions at its
default settings, the request setting no sampling field.

`python -m omni.server` (no flags, as users run it) is started as a subprocess, from this
tree or from another checkout (--tree: an older commit, for the BEFORE numbers), and asked
through the HTTP API, --concurrency requests at a time:

  text     POST /v1/chat/completions, model assistant, each of 20 questions with a known
           one-word answer --rounds times; correct = the answer holds that word
  spoken   the README's first command (model assistant, modalities text+audio, voice
           alloy, wav) --readme times, plus 5 other questions twice each: the transcript's
           correctness and the answer's seconds of audio

Reports the share correct, answer tokens (usage.completion_tokens) and audio seconds, and
the issue's bar: the README's command answers with "Paris" at least 9 times in 10, every
spoken answer under 15 s. Each run writes default-LABEL.json; default.md shows every
label's numbers found in the results directory.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import re
import statistics
import time
import wave
from pathlib import Path
from typing import Any

from bench.common import code_commit, hardware, say

DESCRIPTION = __doc__
README_QUESTION = "What is the capital of France?"
# (question, accepted answer words): one word each, a few spellings of it
QUESTIONS = [
    (README_QUESTION, ["Paris"]),
    ("What is the capital of Japan?", ["Tokyo"]),
    ("What is the capital of Italy?", ["Rome"]),
    ("What is the capital of Germany?", ["Berlin"]),
    ("What is the capital of Spain?", ["Madrid"]),
    ("What is the capital of Russia?", ["Moscow"]),
    ("What is the capital of Egypt?", ["Cairo"]),
    ("What is the largest planet in our solar system?", ["Jupiter"]),
    ("Which planet is known as the Red Planet?", ["Mars"]),
    ("What is the largest ocean on Earth?", ["Pacific"]),
    ("What color is the sky on a clear day?", ["blue"]),
    ("How many legs does a spider have?", ["eight", "8"]),
    ("How many days are in a week?", ["seven", "7"]),
    ("Who wrote Romeo and Juliet?", ["Shakespeare"]),
    ("What is the largest mammal?", ["whale"]),
    ("In which country are the pyramids of Giza?", ["Egypt"]),
    ("Which animal is known as the king of the jungle?", ["lion"]),
    ("What language is spoken in Brazil?", ["Portuguese"]),
    ("What is the opposite of hot?", ["cold"]),
    ("What is the chemical symbol for gold?", ["Au"]),
]
SPOKEN_OTHERS = [1, 7, 11, 13, 16]  # indices into QUESTIONS, asked twice each
MAX_AUDIO_S = 15.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--label", default="after", help="names this run's numbers")
    parser.add_argument("--tree", default=None,
                        help="run the server from this checkout (default: this one)")
    parser.add_argument("--rounds", type=int, default=5, help="times each question is asked")
    parser.add_argument("--readme", type=int, default=10, help="times the README command runs")
    parser.add_argument("--concurrency", type=int, default=8, help="requests at a time")
    parser.add_argument("--out", default="bench/results", help="report directory")


def correct(text: str, accepted: list[str]) -> bool:
    return any(re.search(rf"\b{re.escape(a)}\b", text, re.IGNORECASE) for a in accepted)


def wav_seconds(data: bytes) -> float:
    with wave.open(io.BytesIO(data)) as w:
        return w.getnframes() / w.getframerate()


async def _ask(session: Any, base: str, question: str, spoken: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "assistant",
                            "messages": [{"role": "user", "content": question}]}
    if spoken:  # the README's first command, as written there
        body.update(modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"})
    start = time.perf_counter()
    async with session.post(f"{base}/v1/chat/completions", json=body) as r:
        reply = await r.json()
    if r.status != 200:
        raise RuntimeError(f"{r.status}: {reply}")
    message = reply["choices"][0]["message"]
    audio = message.get("audio") or {}
    text = message.get("content") or audio.get("transcript") or ""
    return {"question": question, "text": text, "seconds": time.perf_counter() - start,
            "tokens": (reply.get("usage") or {}).get("completion_tokens"),
            "audio_s": wav_seconds(base64.b64decode(audio["data"])) if spoken else None}


async def _measure(base: str, args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    gate = asyncio.Semaphore(args.concurrency)

    async def one(session: Any, index: int, spoken: bool) -> dict[str, Any]:
        async with gate:
            result = await _ask(session, base, QUESTIONS[index][0], spoken)
        result["correct"] = correct(result["text"], QUESTIONS[index][1])
        return result

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        await one(session, 0, False)  # warm-up, unmeasured
        text = [one(session, i, False) for i in range(len(QUESTIONS)) for _ in range(args.rounds)]
        spoken = [one(session, 0, True) for _ in range(args.readme)]
        spoken += [one(session, i, True) for i in SPOKEN_OTHERS for _ in range(2)]
        started = time.perf_counter()
        text_results = await asyncio.gather(*text)
        text_wall = time.perf_counter() - started
        started = time.perf_counter()
        spoken_results = await asyncio.gather(*spoken)
        spoken_wall = time.perf_counter() - started
    return {"text": text_results, "spoken": spoken_results,
            "wall_s": {"text": round(text_wall, 1), "spoken": round(spoken_wall, 1)}}


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median": round(statistics.median(ordered), 1), "max": round(ordered[-1], 1),
            "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 1)}


def summarize(raw: dict[str, Any], readme: int) -> dict[str, Any]:
    text, spoken = raw["text"], raw["spoken"]
    readme_runs = spoken[:readme]
    audio = [r["audio_s"] for r in spoken]
    return {
        "text_correct": sum(r["correct"] for r in text), "text_total": len(text),
        "text_tokens": _stats([r["tokens"] or 0 for r in text]),
        "spoken_correct": sum(r["correct"] for r in spoken), "spoken_total": len(spoken),
        "spoken_tokens": _stats([r["tokens"] or 0 for r in spoken]),
        "audio_s": _stats(audio),
        "readme_paris": sum(r["correct"] for r in readme_runs), "readme_total": len(readme_runs),
        "readme_audio_max_s": round(max(r["audio_s"] for r in readme_runs), 1),
        "bar_met": sum(r["correct"] for r in readme_runs) >= 0.9 * len(readme_runs)
                   and max(audio) < MAX_AUDIO_S,
        "per_question": {q: sum(r["correct"] for r in text if r["question"] == q)
                         for q, _ in QUESTIONS},
    }


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from bench.tts import start_server

    tree = Path(args.tree).resolve() if args.tree else Path.cwd()
    say(f"[default] starting python -m omni.server (no flags) from {tree} ({args.label})")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    log: list[str] = []
    proc, base = start_server(None, env=env, cwd=str(tree), timeout_s=600.0, log=log)
    try:
        raw = asyncio.run(_measure(base, args))
    except BaseException:
        say("[default] the server's last lines:\n" + "".join(log[-30:]))
        raise
    finally:
        proc.terminate()
        proc.wait(60)
    result = {"label": args.label, "tree": str(tree), "commit": code_commit(tree),
              "command": "python -m bench " + " ".join(argv), "hardware": hardware(),
              "rounds": args.rounds, "summary": summarize(raw, args.readme), **raw}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"default-{args.label}.json").write_text(json.dumps(result, indent=1) + "\n")
    from bench.default_report import write_report

    write_report(out)
    say(f"[default] {args.label}: {json.dumps(result['summary'])}")
    return 0
