"""Image chat (Qwen2.5-VL / Qwen3-VL) and Whisper in the HF layout, in-process: what
batching across requests buys.

  vl       N requests, each one distinct image + a question, added at once to the AR
           engine: wall time to every answer (greedy, --new-tokens), the prompt encoder's
           batch sizes; and the encoder alone: N prompts in one encode_batch (one vision-
           tower call) vs one encode call per prompt
  whisper  N clips of --clip-seconds through the generation engine (`whisper_hf` runner:
           one generate() per group of ready clips) vs generate() per clip, one after
           another; real-time factor = wall / audio seconds

--model DIR serves a release directory; without it the tiny random fixture of --family
is built (CPU-sized: the numbers then say what the batching costs or saves, not a real
model's speed). Writes vlm-<tag>.md and vlm-<tag>.json under --out.
"""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path
from typing import Any

from bench.common import hardware, say

DESCRIPTION = __doc__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--family", choices=("qwen2_5_vl", "qwen3_vl", "whisper_hf"),
                        default="qwen2_5_vl")
    parser.add_argument("--model", help="a release directory (default: the tiny fixture)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--concurrency", default="1,8", help="requests at once, a list")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=112, help="square images, pixels")
    parser.add_argument("--clip-seconds", type=float, default=5.0)
    parser.add_argument("--tag", default="cpu")
    parser.add_argument("--out", default="bench/results")


def _model_dir(args: argparse.Namespace) -> str:
    if args.model:
        return args.model
    from omni.fixtures.tiny_models import ensure_tiny_model

    return str(ensure_tiny_model(args.family, progress=say))


def _png(size: int, seed: int) -> bytes:
    import numpy as np
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((size, size, 3)) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _vl_level(engine: Any, n: int, args: argparse.Namespace) -> dict[str, Any]:
    from omni.engines.base import EngineRequest

    prompts = [{"messages": [{"role": "user", "content": [
        {"type": "image", "image": {"data": _png(args.image_size, 1000 * n + i)}},
        {"type": "text", "text": "What is in the picture?"}]}]} for i in range(n)]
    params = {"temperature": 0, "max_tokens": args.new_tokens, "ignore_eos": True}
    engine._encoder.batches.clear()
    start = time.perf_counter()
    for i, inputs in enumerate(prompts):
        engine.add(EngineRequest(f"r{n}-{i}", inputs, dict(params)))
    while engine.has_work():
        for out in engine.step():
            if out.error:
                raise RuntimeError(out.error)
    wall = time.perf_counter() - start
    media = engine.lm.media
    pairs = [(p["messages"], None) for p in prompts]
    timings = {}
    for label, fn in (("batched", lambda: media.encode_batch(pairs)),
                      ("one_by_one", lambda: [media.encode(m, t) for m, t in pairs])):
        fn()  # warm
        _sync(args.device)
        t = time.perf_counter()
        fn()
        _sync(args.device)
        timings[label] = time.perf_counter() - t
    return {"requests": n, "wall_s": wall, "tokens_per_s": n * args.new_tokens / wall,
            "encoder_batches": list(engine._encoder.batches),
            "encode_batched_s": timings["batched"], "encode_one_by_one_s": timings["one_by_one"]}


def _whisper_level(runner: Any, n: int, args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from omni.engines.base import EngineRequest
    from omni.engines.generation.engine import GenerationEngine
    from omni.models.whisper import SAMPLE_RATE

    rng = np.random.default_rng(n)
    samples = int(SAMPLE_RATE * args.clip_seconds)
    clips = [(rng.standard_normal(samples) * 6000).astype("<i2") for _ in range(n)]
    engine = GenerationEngine(runner)
    start = time.perf_counter()
    for i, clip in enumerate(clips):
        engine.add(EngineRequest(f"w{i}", {"audio": {"pcm_s16le": clip.tobytes(),
                                                     "sample_rate": SAMPLE_RATE}}, {}))
    while engine.has_work():
        for out in engine.step():
            if out.error:
                raise RuntimeError(out.error)
    batched = time.perf_counter() - start
    start = time.perf_counter()
    for clip in clips:
        runner.run_items([clip.astype(np.float32) / 32768.0], [{}])
    alone = time.perf_counter() - start
    audio = n * args.clip_seconds
    return {"requests": n, "batched_s": batched, "one_by_one_s": alone,
            "rtf_batched": batched / audio, "rtf_one_by_one": alone / audio,
            "calls": engine.stats()["calls"]}


def run(args: argparse.Namespace, argv: list[str]) -> int:
    model_dir = _model_dir(args)
    levels = [int(c) for c in str(args.concurrency).split(",")]
    if args.family == "whisper_hf":
        from omni.models import build_runner

        runner = build_runner("whisper_hf", model_dir=model_dir, device=args.device,
                              dtype="auto", options={"max_new_tokens": args.new_tokens})
        rows = [_whisper_level(runner, n, args) for n in levels]
    else:
        from omni.engines.ar.engine import AREngine

        engine = AREngine(model_dir, device=args.device)
        rows = [_vl_level(engine, n, args) for n in levels]
    for row in rows:
        rounded = {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}
        say(f"[vlm] {args.family} {json.dumps(rounded)}")
    _write(args, model_dir, rows, argv)
    return 0


def _write(args: argparse.Namespace, model_dir: str, rows: list[dict[str, Any]],
           argv: list[str]) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"family": args.family, "model_dir": model_dir, "device": args.device,
              "argv": argv, "hardware": hardware(), "levels": rows}
    (out / f"vlm-{args.family}-{args.tag}.json").write_text(json.dumps(report, indent=2))
    keys = list(rows[0])
    lines = [f"# bench vlm: {args.family} on {args.device} ({args.tag})", "",
             f"`python -m bench vlm {' '.join(argv[1:])}`", "",
             "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(f"{r[k]:.4f}" if isinstance(r[k], float) else str(r[k])
                                for k in keys) + " |" for r in rows]
    (out / f"vlm-{args.family}-{args.tag}.md").write_text("\n".join(lines) + "\n")
