"""The policy engine on the tiny random π0, loaded by the real adapter from LeRobot's
release layout, against transformers' own ``sample_actions`` as the reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omni.engines.base import EngineRequest, PolicyJob
from omni.engines.policy.engine import PolicyEngine
from omni.fixtures.tiny_models import ensure_tiny_model
from omni.models import build_policy
from omni.wire.arrays import pack_tree

torch.set_num_threads(1)
PROMPTS = ("pick up the red block", "open the top drawer and put the bowl inside", "wave")


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    model_dir = ensure_tiny_model("pi0", tmp_path_factory.getbasetemp() / "models")
    return build_policy("pi0", model_dir=str(model_dir), device="cpu", dtype="float32", options={})


def observation(i: int) -> dict:
    """LIBERO's keys, as openpi's LIBERO client sends them."""
    rng = np.random.default_rng(i)
    return {"observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/state": rng.standard_normal(8).astype(np.float32),
            "prompt": PROMPTS[i % len(PROMPTS)]}


def request(rid: str, obs: dict, **params) -> EngineRequest:
    return EngineRequest(rid, {"observation": pack_tree(obs)}, params)


def drain(engine: PolicyEngine) -> tuple[dict, dict]:
    results, errors = {}, {}
    for _ in range(1000):
        if not engine.has_work():
            break
        for out in engine.step():
            if out.error:
                errors[out.request_id] = out.error
            else:
                results[out.request_id] = out.data
    return results, errors


def reference(policy, obs: dict, seed: int) -> torch.Tensor:
    """transformers' sample_actions on the same inputs and noise, cut and unnormalised."""
    job = policy.prepare("ref", {"observation": pack_tree(obs)}, seed, None)
    n_cameras = job.inputs["pixel_values"].shape[1]
    raw = policy.model.sample_actions(
        state=job.state, input_ids=job.inputs["input_ids"],
        pixel_values=job.inputs["pixel_values"], noise=job.actions.clone(),
        attention_mask=job.inputs["attention_mask"],
        pixel_attention_mask=torch.ones(1, n_cameras, dtype=torch.bool))
    return policy.finish(PolicyJob("ref", {}, job.state, raw, job.steps, seed, n_cameras))[
        "actions"]


def test_the_release_loads_through_transformers_renaming(policy, tmp_path):
    """The tiny fixture's weights are stored under LeRobot's names: every one of them must
    have reached the model (a missed rename would leave a freshly initialised tensor)."""
    from safetensors.torch import load_file

    from omni.fixtures.tiny_pi0 import lerobot_names

    stored = load_file(str(ensure_tiny_model("pi0", tmp_path / "m") / "model.safetensors"))
    loaded = lerobot_names(policy.model.state_dict())
    assert set(stored) == set(loaded)
    for name, tensor in stored.items():
        assert torch.equal(tensor, loaded[name]), name
    assert policy.info()["action_width"] == 7 and policy.info()["horizon"] == 50


def test_eight_robots_share_forward_passes_and_match_sample_actions(policy):
    engine = PolicyEngine(policy, {})
    observations = [observation(i) for i in range(8)]
    for i, obs in enumerate(observations):
        engine.add(request(f"r{i}", obs, seed=100 + i))
    results, errors = drain(engine)
    assert not errors
    stats = engine.stats()
    assert stats["prefix_calls"] == 1 and stats["step_calls"] == 10
    assert stats["max_rows"] == 8 and stats["chunks"] == 8
    chunks = [results[f"r{i}"]["actions"] for i in range(8)]
    assert all(c.shape == (50, 7) and c.dtype == torch.float32 for c in chunks)
    # the fixture's output depends on its input: otherwise equality would prove nothing
    assert min(float((chunks[0] - c).abs().max()) for c in chunks[1:]) > 1e-2
    for i, obs in enumerate(observations):
        expected = reference(policy, obs, 100 + i)
        assert torch.allclose(chunks[i], expected, atol=1e-5), i


def test_robots_joining_mid_chunk_step_together_and_stay_exact(policy):
    engine = PolicyEngine(policy, {})
    engine.add(request("first", observation(0), seed=1))
    for _ in range(4):  # the first robot is 3 steps into its chunk
        engine.step()
    engine.add(request("late", observation(1), seed=2))
    results, errors = drain(engine)
    assert not errors and engine.stats()["max_rows"] == 2
    assert torch.allclose(results["first"]["actions"], reference(policy, observation(0), 1),
                          atol=1e-5)
    assert torch.allclose(results["late"]["actions"], reference(policy, observation(1), 2),
                          atol=1e-5)


def test_the_seed_decides_the_noise(policy):
    engine = PolicyEngine(policy, {})
    obs = observation(3)
    for rid, seed in (("a", 5), ("b", 5), ("c", 6)):
        engine.add(request(rid, obs, seed=seed))
    results, _ = drain(engine)
    assert torch.equal(results["a"]["actions"], results["b"]["actions"])
    assert not torch.allclose(results["a"]["actions"], results["c"]["actions"], atol=1e-3)
    assert results["a"]["seed"] == 5


def _without(key: str) -> dict:
    obs = observation(0)
    del obs[key]
    return obs


@pytest.mark.parametrize("obs, message", [
    ({"observation/state": np.zeros(8, np.float32), "prompt": "x"},
     "none of this policy's cameras"),
    (_without("observation/wrist_image"), "no 'observation/wrist_image'"),
    ({**observation(0), "observation/image": "not an image"},
     "camera 'observation/image' must be an image array"),
    ({**observation(0), "observation/image": np.zeros((224, 224, 4), np.uint8)},
     "camera 'observation/image' has shape (224, 224, 4)"),
    ({**observation(0), "observation/wrist_image": np.zeros((9, 9, 3), np.int64)},
     "camera 'observation/wrist_image' has dtype int64"),
    ({**observation(0), "observation/image": np.full((9, 9, 3), 200.0, np.float32)},
     "camera 'observation/image' is a float frame with values 200..200"),
    ({**observation(0), "observation/image": np.zeros((5000, 3, 3), np.uint8)},
     "each side must be"),
    (_without("observation/state"), "no 'observation/state'"),
    ({**observation(0), "observation/state": np.zeros(5)},
     "'observation/state' has 5 values; this policy's robot has 8"),
    ({**observation(0), "observation/state": "eight"}, "'observation/state' must be a 1-D"),
    ({**observation(0), "observation/extra_camera": np.zeros((224, 224, 3), np.uint8)},
     "key 'observation/extra_camera' is not one this policy reads"),
    (_without("prompt"), "no 'prompt'"),
])
def test_a_bad_observation_fails_alone(policy, obs, message):
    engine = PolicyEngine(policy, {})
    engine.add(request("good", observation(0), seed=1))
    engine.add(request("bad", obs, seed=1))
    results, errors = drain(engine)
    assert "good" in results and message in errors["bad"], errors


def test_sessions_keep_an_episode_and_free_it(policy):
    engine = PolicyEngine(policy, {})
    for rid in ("a", "b"):
        engine.add(request(rid, observation(0), seed=1, session="robot-1"))
        results, _ = drain(engine)
    assert results["b"]["episode_step"] == 2
    assert engine.stats()["session_bytes"]["robot-1"] >= 50 * 7 * 4
    assert engine.end_session("robot-1", "close")
    assert engine.stats()["session_bytes"] == {}


def test_abort_mid_chunk_frees_the_job(policy):
    engine = PolicyEngine(policy, {})
    engine.add(request("a", observation(0), seed=1))
    engine.add(request("b", observation(1), seed=1))
    engine.step()
    engine.step()
    assert policy._cache is not None  # a batch is stepping
    engine.abort(["a"])
    results, errors = drain(engine)
    assert set(results) == {"b"} and not errors
    assert engine.stats()["running"] == 0 and engine.stats()["tensor_bytes"] == 0
    assert policy._cache is None  # the batch's concatenated KV went with its robots


def test_steps_are_honoured(policy):
    engine = PolicyEngine(policy, {})
    engine.add(request("four", observation(0), seed=1, steps=4))
    engine.add(request("default", observation(1), seed=1))
    results, errors = drain(engine)
    assert not errors and results["four"]["steps"] == 4 and results["default"]["steps"] == 10
    assert torch.isfinite(results["default"]["actions"]).all()


def test_every_key_style_reads_the_same_robot(policy):
    """LIBERO's keys and LeRobot's own feature names feed the same cameras and state: the
    same frames under either name give the same chunk."""
    libero = observation(2)
    lerobot = {"observation.images.image": libero["observation/image"],
               "observation.images.wrist_image": libero["observation/wrist_image"],
               "observation.state": libero["observation/state"], "prompt": libero["prompt"]}
    swapped = {**libero, "observation/image": libero["observation/wrist_image"],
               "observation/wrist_image": libero["observation/image"]}
    engine = PolicyEngine(policy, {})
    for rid, obs in (("libero", libero), ("lerobot", lerobot), ("swapped", swapped)):
        engine.add(request(rid, obs, seed=9))
    results, errors = drain(engine)
    assert not errors
    assert torch.equal(results["libero"]["actions"], results["lerobot"]["actions"])
    # the cameras' order reaches the model (a little on this tiny one): a mix-up shows
    swap = (results["libero"]["actions"] - results["swapped"]["actions"]).abs().max()
    assert float(swap) > 1e-5


def test_prompts_are_tokenized_once_per_prompt_and_camera_count(policy, monkeypatch):
    from omni.models import pi0

    policy._prompts.clear()
    first = policy._prompt(PROMPTS[0], 2)
    assert policy._prompt(PROMPTS[0], 2) is first  # a robot's repeated prompt: no work
    other = policy._prompt(PROMPTS[1], 2)
    assert not torch.equal(other[0], first[0])  # another prompt, other tokens
    assert not torch.equal(policy._prompt(PROMPTS[0], 1)[0], first[0])  # fewer image tokens
    monkeypatch.setattr(pi0, "PROMPT_CACHE", 2)
    policy._prompt(PROMPTS[2], 2)  # a fourth into two places: the two least recent go
    assert list(policy._prompts) == [(PROMPTS[0], 1), (PROMPTS[2], 2)]
    again = policy._prompt(PROMPTS[0], 2)
    assert again is not first and torch.equal(again[0], first[0])
