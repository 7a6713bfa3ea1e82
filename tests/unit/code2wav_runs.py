"""What the GenerationEngine tests over the Qwen3-Omni code2wav runner share
(test_generation_batching.py, test_generation_streaming.py, test_generation_failures.py):
the tiny model's code2wav, random codes, and driving an engine to its outputs."""

from __future__ import annotations

import functools
import random
from pathlib import Path

import torch

from omni.fixtures import ensure_tiny_model
from omni.models.qwen3_omni import load_code2wav

NQ, CB = 4, 64
REL_TOL = 1e-5  # relative to the signal's max |x| (random weights: max |x| ~ 5e-7)


def model_dir(tmp_path_factory) -> Path:
    return ensure_tiny_model("qwen3_omni", cache_dir=tmp_path_factory.getbasetemp() / "models")


@functools.cache
def _load(directory: str):
    return load_code2wav(directory)


def code2wav(tmp_path_factory):
    """The tiny model's code2wav, loaded once for all the modules that use it."""
    return _load(str(model_dir(tmp_path_factory)))


def random_codes(t: int, seed: int) -> torch.Tensor:
    return torch.randint(0, CB, (NQ, t), generator=torch.Generator().manual_seed(seed))


def audio_of(data) -> torch.Tensor:
    return data["audio"]  # the engine hands out a float32 tensor (published by the process)


def drain(engine, outs=None, limit=1000):
    outs = {} if outs is None else outs
    for _ in range(limit):
        if not engine.has_work():
            break
        for o in engine.step():
            outs.setdefault(o.request_id, []).append(o)
    return outs


def rel_diff(a: torch.Tensor, b: torch.Tensor, scale: float) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max()) / scale if a.numel() else 0.0


def feed_stream(engine, rid, frames, rng: random.Random, outs, producer="talker"):
    """Feed frames in random-size appends, stepping in between."""
    t, seq = frames.shape[-1], 0
    pos = 0
    while pos < t:
        n = rng.randint(1, 7)
        piece = frames[:, pos:pos + n]
        pos += piece.shape[-1]
        engine.append(rid, producer, seq, {"codes": piece.tolist()}, pos >= t)
        seq += 1
        if rng.random() < 0.5:
            for o in engine.step():
                outs.setdefault(o.request_id, []).append(o)
