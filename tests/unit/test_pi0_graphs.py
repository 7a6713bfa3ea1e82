"""The bodies that omni/models/pi0_graphs.py captures, run eagerly on the CPU (no pool):
they must compute what the adapter's own eager passes compute, with padded buckets, robots
reloaded when the batch changes and not when it stays. The capture itself: tests/gpu."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omni.engines.base import EngineLoadError
from omni.fixtures.tiny_models import ensure_tiny_model
from omni.models import build_policy
from omni.models.pi0_graphs import PI0Graphs
from omni.wire.arrays import pack_tree

torch.set_num_threads(1)
PROMPTS = ("pick up the red block", "open the top drawer and put the bowl inside", "wave")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(ensure_tiny_model("pi0", tmp_path_factory.getbasetemp() / "models"))


@pytest.fixture(scope="module")
def policy(model_dir):
    return build_policy("pi0", model_dir=model_dir, device="cpu", dtype="float32", options={})


def prepared(policy, n: int, offset: int = 0) -> list:
    jobs = []
    for i in range(offset, offset + n):
        rng = np.random.default_rng(i)
        obs = {"observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
               "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
               "observation/state": rng.standard_normal(8), "prompt": PROMPTS[i % 3]}
        jobs.append(policy.prepare(f"r{i}", {"observation": pack_tree(obs)}, i, None))
    return jobs


def test_the_prefix_body_matches_the_eager_pass(policy):
    jobs = prepared(policy, 3)
    # prompts of other lengths: the rows' masks differ, so a mask mix-up would show
    assert len({int(j.inputs["attention_mask"].sum()) for j in jobs}) == 3
    graphs = PI0Graphs(policy.model, [1, 2, 4], capture=False)
    with torch.no_grad():
        kv = graphs.prefix(jobs)  # bucket 4: one row past the robots
        eager = policy._prefix_kv(jobs, torch.cat([j.inputs["attention_mask"]
                                                   for j in jobs]))
    assert len(kv) == len(eager) == 2
    for (k, v), (ek, ev) in zip(kv, eager, strict=True):
        assert k.shape == ek.shape and v.shape == ev.shape
        assert torch.allclose(k, ek, atol=1e-5) and torch.allclose(v, ev, atol=1e-5)
    assert not graphs.off


def test_the_step_body_matches_the_eager_step(policy):
    jobs = prepared(policy, 5)
    policy.prefix(jobs)
    graphs = PI0Graphs(policy.model, [1, 2, 4, 8], capture=False)
    rng = torch.Generator().manual_seed(0)
    for batch in (jobs[:3], jobs[:3], jobs[1:], jobs[4:]):  # same, changed, one robot
        actions = torch.randn(len(batch), 50, 32, generator=rng)
        t = torch.rand(len(batch), generator=rng)
        out = graphs.velocity(batch, actions, t)
        policy.idle()
        expected = policy.velocity(batch, actions, t)
        assert out.shape == expected.shape == (len(batch), 50, 32)
        assert torch.allclose(out, expected, atol=1e-5), float((out - expected).abs().max())
        assert float(out.std()) > 1e-3  # not a constant that would match anything
    step = graphs.steps[jobs[0].step_key]
    assert step.loaded == tuple((j.request_id, id(j)) for j in jobs[4:])


def test_a_batch_past_the_largest_bucket_goes_eager(policy):
    jobs = prepared(policy, 3)
    policy.prefix(jobs)
    graphs = PI0Graphs(policy.model, [1, 2], capture=False)
    assert graphs.velocity(jobs, torch.zeros(3, 50, 32), torch.ones(3)) is None
    assert graphs.prefix(jobs) is None and not graphs.off


def test_cuda_graphs_are_off_on_the_cpu_and_cannot_be_asked_for(policy, model_dir):
    assert policy.graphs is None and policy.info()["cuda_graphs"] == "off"
    with pytest.raises(EngineLoadError, match="cuda_graphs needs device cuda"):
        build_policy("pi0", model_dir=model_dir, device="cpu", dtype="float32",
                     options={"cuda_graphs": True})
