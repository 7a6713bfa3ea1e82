"""World sessions on the tiny random Cosmos 3, loaded by the real adapter from the
diffusers release layout, in the diffusion engine, against diffusers' own
``Cosmos3OmniPipeline`` called with the same inputs.

The conditioning rule checked here (omni/models/cosmos3_world.py): chunk k+1 is the
pipeline's forward_dynamics from the last frame of chunk k (uint8 RGB), with the
session's prompt and domain and the step's actions and seed; chunk 1 starts from the
session's first frame, and so does the first chunk after a reset."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omni.engines.base import EngineRequest
from omni.engines.diffusion.engine import DiffusionEngine
from omni.fixtures.tiny_models import ensure_tiny_model
from omni.media.image import encode_image
from omni.models import build_denoiser
from omni.wire.arrays import pack

torch.set_num_threads(1)
PROMPT, DOMAIN, STEPS = "pick up the red cup", "droid_lerobot", 4
FIRST = np.random.RandomState(3).randint(0, 255, (64, 64, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return ensure_tiny_model("cosmos3", tmp_path_factory.getbasetemp() / "models")


@pytest.fixture(scope="module")
def denoiser(model_dir):
    return build_denoiser("cosmos3_world", model_dir=str(model_dir), device="cpu", dtype="float32",
                          options={})


@pytest.fixture(scope="module")
def stock(model_dir):
    """diffusers' own pipeline, loaded apart (the adapter swaps its attention processor)."""
    from diffusers import Cosmos3OmniPipeline

    pipe = Cosmos3OmniPipeline.from_pretrained(str(model_dir))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def actions(seed: int, width: int = 10) -> np.ndarray:
    return np.random.RandomState(seed).randn(4, width).astype(np.float32)


def step(engine, rid, session, seed, acts, first=None, **params):
    inputs = {"actions": pack(acts), "prompt": PROMPT, "domain": DOMAIN}
    if first is not None:
        inputs["image"] = encode_image(first)
    engine.add(EngineRequest(rid, inputs, {"session": session, "seed": seed, "steps": STEPS,
                                           **params}))


def near(a: torch.Tensor, b: torch.Tensor) -> bool:
    diff = (a.int() - b.int()).abs()
    return a.shape == b.shape and int(diff.max()) <= 2 and float(diff.float().mean()) < 0.1


def drain(engine):
    results, errors = {}, {}
    while engine.has_work():
        for out in engine.step():
            if out.error:
                errors[out.request_id] = out.error
            elif out.finished:
                results[out.request_id] = out.data
    return results, errors


def reference(pipe, image: np.ndarray, seed: int, acts: np.ndarray,
              guidance: float = 1.0) -> torch.Tensor:
    from diffusers import CosmosActionCondition
    from PIL import Image

    action = CosmosActionCondition(
        mode="forward_dynamics", chunk_size=4, domain_name=DOMAIN, resolution_tier=256,
        raw_actions=torch.from_numpy(acts), image=Image.fromarray(image))
    video = pipe(prompt=PROMPT, action=action, num_inference_steps=STEPS, guidance_scale=guidance,
                 generator=torch.Generator().manual_seed(seed), output_type="np").video
    return (torch.from_numpy(video).clamp(0, 1) * 255).round().to(torch.uint8)


def test_three_steps_each_conditioned_on_the_last_frame_then_reset(denoiser, stock):
    engine = DiffusionEngine(denoiser, {})
    chunks = []
    for k in range(3):
        step(engine, f"s{k}", "w", 10 + k, actions(k), first=FIRST if k == 0 else None)
        results, errors = drain(engine)
        assert not errors, errors
        chunks.append(results[f"s{k}"])
    assert [c["chunk"] for c in chunks] == [1, 2, 3]
    video = [c["video"] for c in chunks]
    assert video[0].shape == (5, 64, 64, 3) and video[0].dtype == torch.uint8
    assert int(video[1].int().sub(video[0].int()).abs().max()) > 0  # frames vary
    expected = reference(stock, FIRST, 10, actions(0))
    assert torch.equal(video[0], expected)
    for k in (1, 2):  # chunk k+1 from chunk k's last frame
        expected = reference(stock, video[k - 1][-1].numpy(), 10 + k, actions(k))
        assert torch.equal(video[k], expected), k
    # the same step from the first frame differs: the conditioning is what made chunk 2
    assert not torch.equal(video[1], reference(stock, FIRST, 11, actions(1)))
    assert engine.end_session("w", "reset")
    step(engine, "again", "w", 10, actions(0))
    results, _ = drain(engine)
    assert torch.equal(results["again"]["video"], video[0])  # back to the first frame
    assert engine.stats()["session_bytes"]["w"] == 2 * 64 * 64 * 3
    assert engine.end_session("w", "close") and engine.stats()["session_bytes"] == {}


def test_sessions_step_side_by_side_and_share_one_call(denoiser, stock):
    engine = DiffusionEngine(denoiser, {"batch_gain": 0})  # sharing without measuring first
    other = np.random.RandomState(9).randint(0, 255, (64, 96, 3), dtype=np.uint8)
    step(engine, "a", "wa", 1, actions(1), first=FIRST)
    step(engine, "b", "wb", 2, actions(2), first=other)
    guided = np.random.RandomState(5).randint(0, 255, (64, 64, 3), dtype=np.uint8)
    step(engine, "c", "wc", 3, actions(3), first=guided, guidance_scale=3.0)
    results, errors = drain(engine)
    assert not errors
    stats = engine.stats()
    assert stats["transformer_calls"] == 4 and stats["max_rows"] == 4  # 3 sessions, 1 guided
    # packed into one call the matmuls round differently: within 2 uint8 levels (a frame
    # conditioned on another image differs by tens)
    assert near(results["a"]["video"], reference(stock, FIRST, 1, actions(1)))
    assert near(results["b"]["video"], reference(stock, other, 2, actions(2)))
    assert results["b"]["video"].shape[1:3] == (64, 96)
    assert near(results["c"]["video"], reference(stock, guided, 3, actions(3), guidance=3.0))
    assert not near(results["a"]["video"], reference(stock, FIRST, 2, actions(1)))


@pytest.mark.parametrize("change, message", [
    ({"domain": "mars_rover"}, "unknown domain"),
    ({"actions": pack(np.zeros((4, 7), np.float32))}, "width 7"),
    ({"actions": pack(np.full((4, 10), np.nan, np.float32))}, "finite"),
    ({"actions": [1, 2]}, "must be an array"),
    ({"image": b"not an image"}, "not an image"),
])
def test_bad_steps_fail_alone(denoiser, change, message):
    engine = DiffusionEngine(denoiser, {})
    step(engine, "good", "g", 1, actions(1), first=FIRST)
    inputs = {"actions": pack(actions(2)), "prompt": PROMPT, "domain": DOMAIN,
              "image": encode_image(FIRST), **change}
    engine.add(EngineRequest("bad", inputs, {"session": "b", "seed": 1, "steps": STEPS}))
    results, errors = drain(engine)
    assert "good" in results and message in errors["bad"], errors


def test_a_step_without_state_is_refused(denoiser):
    engine = DiffusionEngine(denoiser, {})
    step(engine, "lost", "never-opened", 1, actions(1))
    step(engine, "odd", "w", 1, actions(1), first=FIRST, chunk_size=3)
    _, errors = drain(engine)
    assert "reset it" in errors["lost"] and "multiple of 4" in errors["odd"]
