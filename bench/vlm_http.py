"""The ours-http side of `python -m bench vlm`: `python -m omni.server --model DIR --port 0`
as users run it (bench.ar_ours.start_server: the log to --out, the port from its
"listening on" line; SIGTERM at the end), and c concurrent aiohttp clients per burst.

  image chat  POST /v1/chat/completions: one user message of an image_url part (a data:
              PNG URL) and a text part, temperature 0, max_tokens --new-tokens,
              ignore_eos (every answer that long), stream with include_usage; TTFT is
              the first SSE chunk carrying a choice (the server sends it with the
              engine's first token), as bench ar counts it. Every request's body (and
              WAV file) is made before the burst's clock starts.
  whisper     POST /v1/audio/transcriptions, one WAV file a request, language en,
              response_format verbose_json (its segments carry the token ids: the
              lengths are checked). The preset takes no per-request length, so the
              server runs a copy of whisper_hf.yaml with option max_new_tokens
              (`--pipeline`, bench.ar_ours.target_for); the transcript comes whole, so
              no TTFT. The server decodes the upload with PyAV: without it the side is
              skipped.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from bench.ar_ours import served_id, start_server, stop_server, target_for
from bench.ar_report import summarize
from bench.common import metric_sums, say, text_stream_times
from bench.vlm_sides import LANGUAGE, QUESTION, say_row, wav, whisper_summary


class Skipped(Exception):
    """A side that cannot run here, and why (the report says so)."""


def http_side(family: str, model_dir: str, work: dict[int, dict[str, list[Any]]], args: Any,
              log_path: Path) -> dict[str, Any]:
    whisper = family == "whisper_hf"
    if whisper and importlib.util.find_spec("av") is None:
        raise Skipped("no PyAV here: the server cannot decode the uploaded WAV")
    options = {"max_new_tokens": args.new_tokens} if whisper else None
    with tempfile.TemporaryDirectory() as tmp:
        target = target_for(model_dir, args.device, Path(tmp), options)
        started = time.perf_counter()
        proc, url = start_server(target, "auto", args.server_timeout, log_path)
        say(f"[vlm] ours-http: {' '.join(target)} listening at {url} after "
            f"{time.perf_counter() - started:.0f} s")
        try:
            return asyncio.run(_levels(whisper, url, work, args))
        finally:
            stop_server(proc)


async def _levels(whisper: bool, url: str, work: dict[int, dict[str, list[Any]]],
                  args: Any) -> dict[str, Any]:
    import aiohttp

    most = max(work)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600),
                                     connector=aiohttp.TCPConnector(limit=most + 8)) as session:
        model = await served_id(session, url)
        send, made = (_transcribe, wav) if whisper else (_chat, partial(_chat_body, model, args))
        rows = {}
        for n, items in work.items():
            # the requests' bodies are made before the clock starts, as the in-process side
            # gets its images ready-made: a 448 px PNG's base64 and JSON took ~4 ms a
            # request on a 2-core VM, and the burst's last request went out ~35 ms late
            warm, run = ([made(x) for x in items[k]] for k in ("warm", "run"))
            start = time.perf_counter()  # warm-up: a full burst of other inputs
            await asyncio.gather(*(send(session, url, model, x, start) for x in warm))
            before = await encoder_counts(session, url)
            start = time.perf_counter()
            runs = await asyncio.gather(*(send(session, url, model, x, start) for x in run))
            wall = time.perf_counter() - start
            rows[str(n)] = whisper_summary(runs, wall, args.clip_seconds, args.new_tokens) \
                if whisper else summarize(runs, wall, args.new_tokens)
            after = await encoder_counts(session, url)
            rows[str(n)].update({k: round(v - before.get(k, 0.0), 3) for k, v in after.items()})
            say_row("ours-http", n, rows[str(n)])
        return rows


ENCODER_METRICS = {"omni_replica_encoder_batches": "encoder_batches",
                   "omni_replica_encoder_prompts": "encoder_prompts",
                   "omni_replica_encoder_seconds": "encoder_s"}


async def encoder_counts(session: Any, url: str) -> dict[str, float]:
    """The server's media-encoder counters, summed over replicas (empty for a server whose
    engines have none: Whisper)."""
    return await metric_sums(session, url, ENCODER_METRICS)


def _chat_body(model: str, args: Any, image: bytes) -> bytes:
    """The chat request of one image, as the JSON text sent."""
    data_url = "data:image/png;base64," + base64.b64encode(image).decode()
    return json.dumps({"model": model, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url}},
        {"type": "text", "text": QUESTION}]}],
        "max_tokens": args.new_tokens, "ignore_eos": True, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}}).encode()


async def _chat(session: Any, url: str, model: str, body: bytes,
                start: float) -> dict[str, Any]:
    return await text_stream_times(session, f"{url}/v1/chat/completions", body, start,
                                   lambda choice: (choice.get("delta") or {}).get("content"))


async def _transcribe(session: Any, url: str, model: str, clip: bytes,
                      start: float) -> dict[str, Any]:
    """`clip`: a WAV file's bytes."""
    import aiohttp

    form = aiohttp.FormData()
    for name, value in (("model", model), ("language", LANGUAGE), ("temperature", "0"),
                        ("response_format", "verbose_json")):
        form.add_field(name, value)
    form.add_field("file", clip, filename="clip.wav", content_type="audio/wav")
    async with session.post(f"{url}/v1/audio/transcriptions", data=form) as resp:
        if resp.status != 200:
            raise RuntimeError(f"transcription: HTTP {resp.status}: {await resp.text()}")
        body = await resp.json()
    return {"done": time.perf_counter() - start,
            "tokens": sum(len(s["tokens"]) for s in body["segments"])}
