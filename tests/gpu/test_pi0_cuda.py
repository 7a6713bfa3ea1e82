"""π0 on CUDA (tiny random fixture): the adapter's own image preprocessing against
transformers' PI0ImageProcessor (which needs torchvision: present on the GPU box, not
beside the CPU torch), and the policy engine on the GPU against sample_actions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omni.arrays import pack_tree
from omni.engines.base import EngineRequest, PolicyJob
from omni.engines.policy.engine import PolicyEngine
from omni.fixtures.tiny_models import ensure_tiny_model
from omni.models import build_policy
from omni.models.policy_inputs import image_uint8, resize_pad

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("shape", [(224, 224, 3), (480, 640, 3), (3, 256, 200), (100, 60, 3)])
def test_preprocessing_matches_pi0_image_processor(shape):
    pytest.importorskip("torchvision")
    from transformers import PI0ImageProcessor

    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, shape, dtype=np.uint8)
    hwc = frame if shape[-1] == 3 else frame.transpose(1, 2, 0)
    theirs = PI0ImageProcessor()(images=[hwc], return_tensors="pt")["pixel_values"][0]
    ours = resize_pad(image_uint8("cam", frame), 224)
    assert ours.shape == theirs.shape
    diff = (ours - theirs).abs()
    # the same uint8 kernel and the same arithmetic after it: equal up to float rounding
    assert float(diff.max()) < 1e-6, (float(diff.max()), float(diff.mean()))


def test_policy_engine_on_cuda_matches_sample_actions(tmp_path):
    model_dir = ensure_tiny_model("pi0", tmp_path / "models")
    policy = build_policy("pi0", str(model_dir), "cuda", "float32", {})
    engine = PolicyEngine(policy, {})
    observations = []
    for i in range(4):
        rng = np.random.default_rng(i)
        observations.append({
            "a": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "b": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
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
