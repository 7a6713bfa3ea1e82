"""Cosmos 3's policy mode in the policy engine (tiny random Cosmos 3): several robots
share each transformer call and every chunk equals diffusers' own
``Cosmos3OmniPipeline(..., action=CosmosActionCondition(mode="policy"))`` for its seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omni.engines.base import EngineRequest
from omni.engines.policy.engine import PolicyEngine
from omni.fixtures.tiny_models import ensure_tiny_model
from omni.models import build_policy
from omni.wire.arrays import pack_tree

torch.set_num_threads(1)
STEPS = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return ensure_tiny_model("cosmos3", tmp_path_factory.getbasetemp() / "models")


@pytest.fixture(scope="module")
def policy(model_dir):
    return build_policy("cosmos3_policy", model_dir=str(model_dir), device="cpu", dtype="float32",
                        options={"domain": "droid_lerobot", "steps": STEPS})


def frame(i: int) -> np.ndarray:
    return np.random.RandomState(i).randint(0, 255, (64, 64, 3), dtype=np.uint8)


def reference(model_dir, image: np.ndarray, prompt: str, seed: int) -> torch.Tensor:
    from diffusers import Cosmos3OmniPipeline, CosmosActionCondition
    from PIL import Image

    pipe = Cosmos3OmniPipeline.from_pretrained(str(model_dir))
    pipe.set_progress_bar_config(disable=True)
    action = CosmosActionCondition(mode="policy", chunk_size=4, domain_name="droid_lerobot",
                                   resolution_tier=256, image=Image.fromarray(image))
    return pipe(prompt=prompt, action=action, num_inference_steps=STEPS, guidance_scale=1.0,
                generator=torch.Generator().manual_seed(seed), output_type="latent").action[0]


def test_robots_share_calls_and_match_the_pipeline(policy, model_dir):
    engine = PolicyEngine(policy, {})
    for i in range(3):
        obs = {"observation/image": frame(i), "prompt": f"task {i}"}
        engine.add(EngineRequest(f"r{i}", {"observation": pack_tree(obs)}, {"seed": i}))
    results = {}
    while engine.has_work():
        for out in engine.step():
            assert out.error is None, out.error
            results[out.request_id] = out.data["actions"]
    assert engine.stats()["max_rows"] == 3 and engine.stats()["step_calls"] == STEPS
    assert results["r0"].shape == (4, 10)  # chunk_size x droid's width
    assert float((results["r0"] - results["r1"]).abs().max()) > 1e-2
    for i in range(3):
        expected = reference(model_dir, frame(i), f"task {i}", i)
        assert torch.allclose(results[f"r{i}"], expected, atol=1e-4), i


def test_bad_observations_fail_alone(policy):
    engine = PolicyEngine(policy, {})
    engine.add(EngineRequest("good", {"observation": pack_tree(
        {"observation/image": frame(0), "prompt": "x"})}, {"seed": 1}))
    engine.add(EngineRequest("domain", {"observation": pack_tree(
        {"observation/image": frame(0), "prompt": "x", "domain": "mars"})}, {"seed": 1}))
    engine.add(EngineRequest("blind", {"observation": pack_tree({"prompt": "x"})}, {}))
    engine.add(EngineRequest("broken", {"observation": pack_tree(
        {"observation/image": "not an image", "prompt": "x"})}, {}))
    engine.add(EngineRequest("stray", {"observation": pack_tree(
        {"observation/image": frame(0), "prompt": "x", "gripper": [1.0]})}, {}))
    errors, done = {}, set()
    while engine.has_work():
        for out in engine.step():
            if out.error:
                errors[out.request_id] = out.error
            else:
                done.add(out.request_id)
    assert done == {"good"}
    assert "unknown domain 'mars'" in errors["domain"]
    assert "none of this policy's cameras" in errors["blind"]
    assert "camera 'observation/image' must be an image array" in errors["broken"]
    assert "key 'gripper' is not one this policy reads" in errors["stray"]
