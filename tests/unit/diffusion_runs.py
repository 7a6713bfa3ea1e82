"""What the diffusion engine tests share (test_diffusion_engine.py, test_flux_engine.py,
test_video_families.py, test_hunyuan_image_engine.py, test_hunyuan_video_engine.py): an
engine over a tiny fixture loaded by the real adapter, requests that join a running
batch mid-denoise, and test images."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch
from PIL import Image

from omni.engines.base import EngineRequest
from omni.engines.diffusion.engine import DiffusionEngine
from omni.models import build_denoiser

torch.set_num_threads(1)


def engine(models: Any, family: str, name: str, **options: Any) -> DiffusionEngine:
    """The engine over tiny fixture ``name`` (``models``: the conftest fixture). These
    tests pin step-level batching itself, so every call takes all the rows it can
    (batch_gain 0) unless a test asks otherwise; the measured policy has its own tests
    (test_diffusion_rows.py)."""
    options.setdefault("batch_gain", 0)
    denoiser = build_denoiser(family, model_dir=models(name), device="cpu", dtype="auto",
                              options=options)
    return DiffusionEngine(denoiser, options)


def run(eng: DiffusionEngine, requests: list[tuple], join_after: int = 2
        ) -> tuple[dict[str, Any], dict[str, str]]:
    """(finished outputs, errors) by request id. The first request starts alone; the rest
    join after ``join_after`` steps, so every later one runs while the first is
    mid-denoise at another timestep."""
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    eng.add(EngineRequest(*requests[0]))
    for _ in range(join_after):
        collect(eng.step(), results, errors)
    for request in requests[1:]:
        eng.add(EngineRequest(*request))
    while eng.has_work():
        collect(eng.step(), results, errors)
    return results, errors


def run_clean(eng: DiffusionEngine, requests: list[tuple], join_after: int = 2
              ) -> dict[str, Any]:
    """run(), every request expected to succeed."""
    results, errors = run(eng, requests, join_after)
    assert not errors, errors
    return results


def image(eng: DiffusionEngine, prompt: str, params: dict[str, Any]) -> np.ndarray:
    """One request run alone to its first image, as float pixels."""
    results = run_clean(eng, [(f"image-{params.get('seed')}", {"prompt": prompt}, params)])
    return next(iter(results.values()))["images"][0].numpy().astype(float)


def collect(outputs: list[Any], results: dict[str, Any], errors: dict[str, str]) -> None:
    for out in outputs:
        if out.error:
            errors[out.request_id] = out.error
        elif out.finished:
            results[out.request_id] = out.data


def png(width: int, height: int, seed: int = 0) -> bytes:
    """A PNG of random pixels."""
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()
