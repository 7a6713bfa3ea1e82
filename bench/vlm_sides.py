"""The in-process sides of `python -m bench vlm`: our engines (AREngine for image chat,
GenerationEngine over the whisper_hf runner) and transformers' generate() with the
release's processor, one request at a time. The HTTP side is bench/vlm_http.py.

Every side takes the same workload: per concurrency level, a warm-up burst and a
measured burst of distinct images (or clips), and returns per level a summary: for image
chat ar_report.summarize's (tokens/s, TTFT from the burst's start, ITL), for Whisper
whisper_summary's (real-time factor).
"""

from __future__ import annotations

import io
import time
from typing import Any

from bench.ar_report import summarize
from bench.common import TokenTimes, free_device_memory, percentile, say

QUESTION = "What is in the picture?"
LANGUAGE = "en"  # given to every Whisper side: no side spends a pass detecting it


# -- the workload ---------------------------------------------------------------------------
def png(size: int, seed: int) -> bytes:
    import numpy as np
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((size, size, 3)) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def clip(seconds: float, seed: int) -> Any:
    """Noise as 16 kHz int16 (Whisper pads every clip to its 30 s window anyway)."""
    import numpy as np

    from omni.models.whisper import SAMPLE_RATE

    rng = np.random.default_rng(seed)
    return (rng.standard_normal(int(SAMPLE_RATE * seconds)) * 6000).astype("<i2")


def wav(samples: Any) -> bytes:
    """int16 samples as a WAV file (the server's own header writer)."""
    from omni.media.audio import wav_header
    from omni.models.whisper import SAMPLE_RATE

    data = samples.astype("<i2").tobytes()
    return wav_header(SAMPLE_RATE, len(data)) + data


def workload(whisper: bool, levels: list[int], image_size: int,
             clip_seconds: float) -> dict[int, dict[str, list[Any]]]:
    """level -> {"warm": items, "run": items}, every item distinct, the same for every side."""
    def make(seed: int) -> Any:
        return clip(clip_seconds, seed) if whisper else png(image_size, seed)

    return {n: {"warm": [make(10_000 * n + i) for i in range(n)],
                "run": [make(10_000 * n + 5_000 + i) for i in range(n)]} for n in levels}


def whisper_summary(runs: list[dict[str, Any]], wall: float, clip_seconds: float,
                    new_tokens: int) -> dict[str, Any]:
    audio = len(runs) * clip_seconds
    done = sorted(r["done"] for r in runs)
    return {"requests": len(runs), "audio_s": round(audio, 2), "wall_s": round(wall, 3),
            "rtf": round(wall / audio, 4), "audio_s_per_s": round(audio / wall, 2),
            "latency_p50_s": round(percentile(done, 0.5), 3),
            "tokens": sum(r["tokens"] for r in runs),
            "short_requests": sum(1 for r in runs if r["tokens"] != new_tokens)}


def free(device: str) -> None:
    """What a side held goes back before the next side loads its own copy."""
    held = free_device_memory()
    if device.startswith("cuda"):
        say(f"[vlm]   after freeing: {held:.1f} GiB allocated by this process")


# -- ours, in-process -------------------------------------------------------------------------
def _drain(engine: Any, tracks: dict[str, TokenTimes]) -> None:
    while engine.has_work():
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            if out.error:
                raise RuntimeError(f"{out.request_id}: {out.error}")
            tracks[out.request_id].add(len((out.data or {}).get("token_ids") or ()), now)
            if out.finished:
                tracks[out.request_id].done = now


def _vl_prompt(image: bytes) -> dict[str, Any]:
    # what the API makes of an image_url part: the image's bytes, decoded in the engine
    return {"messages": [{"role": "user", "content": [
        {"type": "image", "image": {"data": image}}, {"type": "text", "text": QUESTION}]}]}


def _engine_burst(engine: Any, images: list[bytes], tag: str,
                  new_tokens: int) -> tuple[list[dict[str, Any]], float]:
    from omni.engines.base import EngineRequest

    params = {"temperature": 0, "max_tokens": new_tokens, "ignore_eos": True}
    tracks = {f"{tag}-{i}": TokenTimes() for i in range(len(images))}
    start = time.perf_counter()
    for rid, image in zip(tracks, images, strict=True):
        engine.add(EngineRequest(rid, _vl_prompt(image), dict(params)))
    _drain(engine, tracks)
    return [t.result(start) for t in tracks.values()], time.perf_counter() - start


def _encode_timings(media: Any, images: list[bytes], device: str) -> dict[str, float]:
    """The vision encoder alone: the burst's prompts in one encode_batch (one tower call)
    vs one encode call per prompt."""
    import torch

    pairs = [(_vl_prompt(image)["messages"], None) for image in images]
    out = {}
    for label, fn in (("encode_batched_s", lambda: media.encode_batch(pairs)),
                      ("encode_one_by_one_s", lambda: [media.encode(m, t) for m, t in pairs])):
        fn()  # warm
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        out[label] = round(time.perf_counter() - start, 4)
    return out


def inproc_vl(model_dir: str, work: dict[int, dict[str, list[Any]]],
              args: Any) -> dict[str, Any]:
    from omni.engines.ar.engine import AREngine

    engine = AREngine(model_dir, device=args.device)
    try:
        rows = {}
        for n, items in work.items():
            # warm-up: a full burst of other images, so every shape the burst needs is ready
            _engine_burst(engine, items["warm"], f"warm{n}", args.new_tokens)
            engine._encoder.batches.clear()
            runs, wall = _engine_burst(engine, items["run"], f"c{n}", args.new_tokens)
            rows[str(n)] = summarize(runs, wall, args.new_tokens) | {
                "encoder_batches": list(engine._encoder.batches),
                **_encode_timings(engine.lm.media, items["run"], args.device)}
            say_row("ours-inproc", n, rows[str(n)])
        return rows
    finally:
        engine.shutdown()
        del engine
        free(args.device)


def _whisper_burst(runner: Any, clips: list[Any]) -> tuple[list[dict[str, Any]], float, int]:
    from omni.engines.base import EngineRequest
    from omni.engines.generation.engine import GenerationEngine
    from omni.models.whisper import SAMPLE_RATE

    engine = GenerationEngine(runner)
    start, done, tokens = time.perf_counter(), {}, {}
    for i, samples in enumerate(clips):
        engine.add(EngineRequest(f"w{i}", {"audio": {"pcm_s16le": samples.tobytes(),
                                                     "sample_rate": SAMPLE_RATE}},
                                 {"language": LANGUAGE}))
    while engine.has_work():
        for out in engine.step():
            if out.error:
                raise RuntimeError(f"{out.request_id}: {out.error}")
            if out.finished:
                done[out.request_id] = time.perf_counter() - start
                tokens[out.request_id] = sum(len(s["tokens"]) for s in out.data["segments"])
    runs = [{"done": done[rid], "tokens": tokens[rid]} for rid in done]
    return runs, time.perf_counter() - start, engine.stats()["calls"]


def inproc_whisper(model_dir: str, work: dict[int, dict[str, list[Any]]],
                   args: Any) -> dict[str, Any]:
    import numpy as np

    from omni.models import build_runner

    runner = build_runner("whisper_hf", model_dir=model_dir, device=args.device, dtype="auto",
                          options={"max_new_tokens": args.new_tokens})
    try:
        rows = {}
        for n, items in work.items():
            _whisper_burst(runner, items["warm"])
            runs, wall, calls = _whisper_burst(runner, items["run"])
            start = time.perf_counter()  # the same runner, one clip per call
            for samples in items["run"]:
                runner.run_items([samples.astype(np.float32) / 32768.0], [{"language": LANGUAGE}])
            alone = time.perf_counter() - start
            rows[str(n)] = whisper_summary(runs, wall, args.clip_seconds, args.new_tokens) | {
                "calls": calls, "one_by_one_s": round(alone, 3),
                "rtf_one_by_one": round(alone / (n * args.clip_seconds), 4)}
            say_row("ours-inproc", n, rows[str(n)])
        return rows
    finally:
        del runner
        free(args.device)


def say_row(side: str, n: int, row: dict[str, Any]) -> None:
    keys = ("tokens_per_s", "ttft_p50_ms", "itl_p50_ms", "rtf", "audio_s_per_s", "wall_s",
            "short_requests")
    say(f"[vlm] {side} c={n}: " + ", ".join(f"{k} {row[k]}" for k in keys if k in row))
