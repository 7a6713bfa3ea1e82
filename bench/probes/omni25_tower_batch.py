"""Qwen2.5-Omni's thinker, C image prompts arriving together: their images through one
vision tower call (the encoder batch, now) vs one call per prompt (before).

`python bench/probes/omni25_tower_batch.py [MODEL_DIR] [--c 4] [--rounds 7]
[--device cpu]`: an AREngine on MODEL_DIR (default: the tiny Qwen2.5-Omni fixture), then
per round both modes, alternating which goes first, each on C fresh distinct 112x112
images (no dedupe) with a short question and 4 greedy tokens: the time from adding the C
requests to the last one's first token (its prompt encoded and prefilled) and to all
finished, and the tower calls (a forward hook on the real vision tower). "per-prompt"
runs the same code one prompt per encode_batch call, which is what the thinker did
before it batched. Prints medians.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from omni.engines.ar.engine import AREngine  # noqa: E402
from omni.engines.base import EngineRequest  # noqa: E402

PARAMS = {"temperature": 0, "max_tokens": 4, "ignore_eos": True}


def _png(seed: int, side: int = 112) -> bytes:
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((side, side, 3)) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def _request(rid: str, image: bytes) -> EngineRequest:
    return EngineRequest(rid, {"messages": [{"role": "user", "content": [
        {"type": "image", "image": {"data": image}},
        {"type": "text", "text": "What is in this picture?"}]}]}, dict(PARAMS))


def _per_prompt(media):
    """encode_batch one prompt at a time: a tower call per prompt (the old behaviour)."""
    batched = type(media).encode_batch
    return lambda prompts: [batched(media, [p])[0] for p in prompts]


def _round(engine: AREngine, images: list[bytes], tag: str) -> tuple[float, float]:
    """(s to the last first token, s to all finished) of one burst."""
    started = time.perf_counter()
    for i, image in enumerate(images):
        engine.add(_request(f"{tag}-{i}", image))
    first: dict[str, float] = {}
    while engine.has_work():
        for o in engine.step():
            assert o.error is None, o.error
            first.setdefault(o.request_id, time.perf_counter() - started)
    return max(first.values()), time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir", nargs="?")
    parser.add_argument("--c", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.model_dir is None:
        from omni.fixtures.tiny_models import ensure_tiny_model

        args.model_dir = str(ensure_tiny_model("qwen2_5_omni"))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    engine = AREngine(args.model_dir, device=args.device)
    media, calls = engine.lm.media, []
    media.thinker.model.visual.register_forward_hook(lambda *_: calls.append(1))
    _round(engine, [_png(10_000 + i) for i in range(args.c)], "warm")
    results: dict[str, list[tuple[float, float, int]]] = {"batched": [], "per-prompt": []}
    seed = 0
    for r in range(args.rounds):
        modes = ["batched", "per-prompt"] if r % 2 == 0 else ["per-prompt", "batched"]
        for mode in modes:
            if mode == "per-prompt":
                media.encode_batch = _per_prompt(media)
            else:
                media.__dict__.pop("encode_batch", None)
            images = [_png(seed + i) for i in range(args.c)]
            seed += args.c
            calls.clear()
            first, total = _round(engine, images, f"{mode}-{r}")
            results[mode].append((first, total, len(calls)))
    print(f"c={args.c}, {args.rounds} rounds, {args.device}, model {args.model_dir}")
    for mode, rows in results.items():
        first = statistics.median(x[0] for x in rows) * 1e3
        total = statistics.median(x[1] for x in rows) * 1e3
        towers = sorted({x[2] for x in rows})
        print(f"{mode:>10}: last first token p50 {first:7.1f} ms, all done p50 "
              f"{total:7.1f} ms, tower calls per burst {towers}")


if __name__ == "__main__":
    main()
