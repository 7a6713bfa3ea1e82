"""An omni thinker (Qwen3-Omni, Qwen2.5-Omni), C audio and/or image prompts arriving
together: their clips through one audio tower call and their images through one vision
tower call (the encoder batch, now) vs one call per prompt (before).

`python bench/probes/omni_tower_batch.py [MODEL_DIR] [--family qwen3_omni|qwen2_5_omni]
[--c 4] [--rounds 7] [--seconds 4] [--images] [--device cpu]`: an AREngine on MODEL_DIR
(default: the family's tiny fixture), then per round both modes, alternating which goes
first, each on C fresh distinct clips of --seconds (a tone per prompt, no dedupe; 0: no
clip) and with --images a distinct 112x112 image each, a short question and 4 greedy
tokens: the time from adding the C requests to the
last one's first token and to all finished, and the tower calls per burst (forward hooks
on the real towers). "per-prompt" runs the same code one prompt per encode_batch call,
which is what the thinker did before it batched. Prints medians.
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


def _clip(seed: int, seconds: float) -> bytes:
    t = np.arange(int(16000 * seconds)) / 16000
    return (0.3 * np.sin(2 * np.pi * (200 + 7 * seed) * t)).astype(np.float32).tobytes()


def _png(seed: int, side: int = 112) -> bytes:
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((side, side, 3)) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def _request(rid: str, seed: int, seconds: float, image: bool) -> EngineRequest:
    parts = [{"type": "input_audio", "input_audio": {
        "pcm_f32le": _clip(seed, seconds), "sample_rate": 16000}}] if seconds > 0 else []
    if image:
        parts.append({"type": "image", "image": {"data": _png(seed)}})
    return EngineRequest(rid, {"messages": [{"role": "user", "content": [
        *parts, {"type": "text", "text": "What is in this?"}]}]}, dict(PARAMS))


def _per_prompt(media):
    """encode_batch one prompt at a time: a tower call per prompt (the old behaviour)."""
    batched = type(media).encode_batch
    return lambda prompts: [batched(media, [p])[0] for p in prompts]


def _round(engine: AREngine, requests: list[EngineRequest]) -> tuple[float, float]:
    """(s to the last first token, s to all finished) of one burst."""
    started = time.perf_counter()
    for request in requests:
        engine.add(request)
    first: dict[str, float] = {}
    while engine.has_work():
        for o in engine.step():
            assert o.error is None, o.error
            first.setdefault(o.request_id, time.perf_counter() - started)
    return max(first.values()), time.perf_counter() - started


def _hook(thinker, name: str, calls: list[str]) -> None:
    module = next(m for n, m in thinker.named_modules() if n.split(".")[-1] == name)
    module.register_forward_hook(lambda *_: calls.append(name))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir", nargs="?")
    parser.add_argument("--family", default="qwen3_omni",
                        help="the tiny fixture when no MODEL_DIR: qwen3_omni, qwen2_5_omni")
    parser.add_argument("--c", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--images", action="store_true")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.model_dir is None:
        from omni.fixtures.tiny_models import ensure_tiny_model

        args.model_dir = str(ensure_tiny_model(args.family))
    if args.seconds <= 0 and not args.images:
        parser.error("nothing to encode: --seconds 0 needs --images")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    engine = AREngine(args.model_dir, device=args.device)
    media, calls = engine.lm.media, []
    for name in ("audio_tower", "visual"):
        _hook(media.thinker, name, calls)

    def burst(tag: str, seed: int) -> list[EngineRequest]:
        return [_request(f"{tag}-{i}", seed + i, args.seconds, args.images)
                for i in range(args.c)]

    _round(engine, burst("warm", 10_000))
    results: dict[str, list[tuple[float, float, int]]] = {"batched": [], "per-prompt": []}
    seed = 0
    for r in range(args.rounds):
        modes = ["batched", "per-prompt"] if r % 2 == 0 else ["per-prompt", "batched"]
        for mode in modes:
            if mode == "per-prompt":
                media.encode_batch = _per_prompt(media)
            else:
                media.__dict__.pop("encode_batch", None)
            calls.clear()
            first, total = _round(engine, burst(f"{mode}-{r}", seed))
            seed += args.c
            results[mode].append((first, total, len(calls)))
    print(f"c={args.c}, {args.rounds} rounds, {args.seconds:g} s clips, images "
          f"{args.images}, {args.device}, model {args.model_dir}")
    for mode, rows in results.items():
        first = statistics.median(x[0] for x in rows) * 1e3
        total = statistics.median(x[1] for x in rows) * 1e3
        towers = sorted({x[2] for x in rows})
        print(f"{mode:>10}: last first token p50 {first:7.1f} ms, all done p50 "
              f"{total:7.1f} ms, tower calls per burst {towers}")


if __name__ == "__main__":
    main()
