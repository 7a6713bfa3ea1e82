"""π0 on CUDA (tiny random fixture): the adapter's own image preprocessing against
transformers' PI0ImageProcessor (which needs torchvision: present on the GPU box, not
beside the CPU torch), and the policy engine on the GPU against sample_actions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omni.engines.base import EngineRequest, PolicyJob
from omni.engines.policy.engine import PolicyEngine
from omni.fixtures.tiny_models import ensure_tiny_model
from omni.models import build_policy
from omni.models.policy_images import image_uint8, resize_pad
from omni.wire.arrays import pack_tree

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("device", ["cpu", "cuda"])  # the adapter normalises on its device
@pytest.mark.parametrize("shape", [(224, 224, 3), (480, 640, 3), (3, 256, 200), (100, 60, 3)])
def test_preprocessing_matches_pi0_image_processor(shape, device):
    pytest.importorskip("torchvision")
    from transformers import PI0ImageProcessor

    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, shape, dtype=np.uint8)
    hwc = frame if shape[-1] == 3 else frame.transpose(1, 2, 0)
    theirs = PI0ImageProcessor()(images=[hwc], return_tensors="pt")["pixel_values"][0]
    ours = resize_pad(image_uint8("cam", frame), 224, device=device)
    assert ours.device.type == device
    ours = ours.cpu()
    assert ours.shape == theirs.shape
    diff = (ours - theirs).abs()
    # the same uint8 kernel and the same arithmetic after it: equal up to float rounding
    assert float(diff.max()) < 1e-6, (float(diff.max()), float(diff.mean()))


def test_policy_engine_on_cuda_matches_sample_actions(tmp_path):
    model_dir = ensure_tiny_model("pi0", tmp_path / "models")
    policy = build_policy("pi0", model_dir=str(model_dir), device="cuda", dtype="float32",
                          options={})
    engine = PolicyEngine(policy, {})
    observations = []
    for i in range(4):
        rng = np.random.default_rng(i)
        observations.append({
            "observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/state": rng.standard_normal(8), "prompt": f"task {i}"})
        engine.add(EngineRequest(f"r{i}", {"observation": pack_tree(observations[-1])},
                                 {"seed": i}))
    results = {}
    while engine.has_work():
        for out in engine.step():
            assert out.error is None, out.error
            results[out.request_id] = out.data["actions"]
    assert engine.stats()["max_rows"] == 4
    for i, obs in enumerate(observations):
        job = policy.prepare("ref", {"observation": pack_tree(obs)}, i, None)
        raw = policy.model.sample_actions(
            state=job.state, input_ids=job.inputs["input_ids"],
            pixel_values=job.inputs["pixel_values"], noise=job.actions.clone(),
            attention_mask=job.inputs["attention_mask"],
            pixel_attention_mask=torch.ones(1, 2, dtype=torch.bool, device="cuda"))
        expected = policy.finish(PolicyJob("ref", {}, job.state, raw, 10, i, 2))["actions"]
        # TF32 matmuls and batch-dependent kernels on the GPU: not bit-exact
        assert torch.allclose(results[f"r{i}"], expected, atol=2e-3), i


# -- CUDA graphs (omni/models/pi0_graphs.py) ------------------------------------------------
def observation(i: int) -> dict:
    rng = np.random.default_rng(i)
    prompts = ("pick up the red block", "open the top drawer and put the bowl inside", "wave")
    return {"observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/state": rng.standard_normal(8), "prompt": prompts[i % 3]}


def sample_actions(policy, obs: dict, seed: int) -> torch.Tensor:
    job = policy.prepare("ref", {"observation": pack_tree(obs)}, seed, None)
    raw = policy.model.sample_actions(
        state=job.state, input_ids=job.inputs["input_ids"],
        pixel_values=job.inputs["pixel_values"], noise=job.actions.clone(),
        attention_mask=job.inputs["attention_mask"],
        pixel_attention_mask=torch.ones(1, 2, dtype=torch.bool, device="cuda"))
    return policy.finish(PolicyJob("ref", {}, job.state, raw, 10, seed, 2))["actions"]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-4), ("bfloat16", 1e-2)])
def test_graphed_passes_equal_the_eager_ones(tmp_path, dtype, tol):
    model_dir = str(ensure_tiny_model("pi0", tmp_path / "models"))
    graphed = build_policy("pi0", model_dir=model_dir, device="cuda", dtype=dtype,
                           options={"graph_batch_sizes": [1, 2, 4, 8]})
    eager = build_policy("pi0", model_dir=model_dir, device="cuda", dtype=dtype,
                         options={"cuda_graphs": False})
    assert graphed.info()["cuda_graphs"] == "on" and eager.info()["cuda_graphs"] == "off"
    assert sorted(graphed.graphs.steps[next(iter(graphed.graphs.steps))].graphs) == [1, 2, 4, 8]
    gen = torch.Generator(device="cuda").manual_seed(0)
    for n in (1, 3, 8, 3):  # 3 runs in bucket 4 (a padded row), again after 8 left stale rows
        jobs = [graphed.prepare(f"r{n}-{i}", {"observation": pack_tree(observation(i))}, i,
                                None) for i in range(n)]
        replays = graphed.graphs.replays
        graphed.prefix(jobs)
        mask = torch.cat([j.inputs["attention_mask"] for j in jobs])
        with torch.no_grad():
            expected_kv = eager._prefix_kv(jobs, mask)
        for i, job in enumerate(jobs):  # each robot's own rows, keys and values
            got = torch.cat([torch.cat(pair) for pair in job.prefix["kv"]])
            want = torch.cat([torch.cat((k[i:i + 1], v[i:i + 1])) for k, v in expected_kv])
            assert rel(got, want) < tol, (n, i)
        actions = torch.randn(n, 50, 32, generator=gen, device="cuda").to(graphed.dtype)
        t = torch.rand(n, generator=gen, device="cuda")
        out = graphed.velocity(jobs, actions, t)
        want = eager.velocity(jobs, actions, t)
        eager.idle()
        assert rel(out, want) < tol, (n, rel(out, want))
        assert float(want.float().std()) > 1e-3
        assert graphed.graphs.replays == replays + 2  # both passes replayed graphs


def test_robots_joining_mid_chunk_through_the_graphs_match_sample_actions(tmp_path):
    """Batches of 1, 3 and 8 robots, the later ones joining mid-chunk; a second round must
    leave the device's memory where the first did (nothing grows across replays)."""
    model_dir = ensure_tiny_model("pi0", tmp_path / "models")
    policy = build_policy("pi0", model_dir=str(model_dir), device="cuda", dtype="float32",
                          options={})
    engine = PolicyEngine(policy, {})
    allocated = []
    for round_ in range(2):
        results = {}
        for i in range(8):
            engine.add(EngineRequest(f"{round_}-{i}", {"observation": pack_tree(
                observation(i))}, {"seed": i}))
            if i in (0, 2):  # 1 robot, then 3, then 8
                for _ in range(3):
                    for out in engine.step():
                        results[out.request_id] = out.data["actions"]
        while engine.has_work():
            for out in engine.step():
                assert out.error is None, out.error
                results[out.request_id] = out.data["actions"]
        assert len(results) == 8
        for i in range(8):
            expected = sample_actions(policy, observation(i), i)
            assert torch.allclose(results[f"{round_}-{i}"], expected, atol=2e-3), i
        del expected
        torch.cuda.synchronize()
        allocated.append(torch.cuda.memory_allocated())
    assert engine.stats()["max_rows"] == 8
    assert policy.info()["cuda_graphs"] == "on" and policy.graphs.replays > 30
    assert allocated[1] == allocated[0], allocated


def test_a_failed_capture_leaves_the_policy_eager_and_right(tmp_path, monkeypatch, caplog):
    from omni.models import pi0_graphs

    def syncing_body(self, b):
        float(self.t[:1].sum())  # a host sync: illegal while capturing
        return original(self, b)

    original = pi0_graphs.StepGraphs.body
    monkeypatch.setattr(pi0_graphs.StepGraphs, "body", syncing_body)
    model_dir = ensure_tiny_model("pi0", tmp_path / "models")
    policy = build_policy("pi0", model_dir=str(model_dir), device="cuda", dtype="float32",
                          options={})
    assert policy.info()["cuda_graphs"].startswith("off (")
    assert "CUDA graphs of the step pass turned off" in caplog.text
    engine = PolicyEngine(policy, {})
    engine.add(EngineRequest("r", {"observation": pack_tree(observation(1))}, {"seed": 1}))
    results = {}
    while engine.has_work():
        for out in engine.step():
            assert out.error is None, out.error
            results[out.request_id] = out.data["actions"]
    assert torch.allclose(results["r"], sample_actions(policy, observation(1), 1), atol=2e-3)
