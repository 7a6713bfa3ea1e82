"""`memory: 60%`: a stage's budget as a share of its GPU (omni/config/memory.py)."""

from __future__ import annotations

import pytest

from omni.config import memory as memory_budget
from omni.config.pipeline import ConfigError, parse_pipeline


def _pipeline(*stages: dict) -> dict:
    names = [s["name"] for s in stages]
    stages[-1]["final_output"] = "text"
    return {"name": "p", "stages": list(stages),
            "edges": [{"from": a, "to": b} for a, b in zip(names, names[1:], strict=False)],
            "outputs": {"text": [names[-1]]}}


def _stage(name: str, memory, devices=("cuda:0",), replicas: int = 1) -> dict:
    return {"name": name, "engine": "echo", "memory": memory, "devices": list(devices),
            "replicas": replicas}


def test_a_percentage_is_a_share_and_bytes_stay_bytes():
    config = parse_pipeline(_pipeline(_stage("a", "60%"), _stage("b", "2GiB"),
                                      _stage("c", " 12.5 % ")))
    a, b, c = config.stages
    assert (a.memory, a.memory_share) == (None, 0.6)
    assert (b.memory, b.memory_share) == (2 * 2**30, None)
    assert c.memory_share == 0.125


@pytest.mark.parametrize("value", ["0%", "150%", "-5%"])
def test_shares_out_of_range_are_refused(value):
    with pytest.raises(ConfigError, match="stages\\[0\\].memory"):
        parse_pipeline(_pipeline(_stage("a", value)))


def test_shares_on_one_gpu_must_fit_it():
    with pytest.raises(ConfigError, match="add up to 120%.*a, b"):
        parse_pipeline(_pipeline(_stage("a", "60%"), _stage("b", "60%")))
    with pytest.raises(ConfigError, match="add up to 120%"):  # two replicas on one GPU
        parse_pipeline(_pipeline(_stage("a", "60%", replicas=2)))
    # 'auto', 'cuda' and 'cuda:0' are the same first GPU
    with pytest.raises(ConfigError, match="add up to 110%"):
        parse_pipeline(_pipeline(_stage("a", "60%", ["auto"]), _stage("b", "50%", ["cuda"])))
    parse_pipeline(_pipeline(_stage("a", "60%", ["cuda:0"]), _stage("b", "60%", ["cuda:1"])))
    parse_pipeline(_pipeline(_stage("a", "60%", ["cuda:0", "cuda:1"], replicas=2)))


def test_budget_in_bytes_on_the_device(monkeypatch):
    monkeypatch.setattr(memory_budget, "gpu_total_bytes", lambda device: 1000)
    assert memory_budget.budget_bytes(None, 0.6, "cuda:0") == 600
    assert memory_budget.budget_bytes(123, None, "cuda:0") == 123
    assert memory_budget.budget_bytes(None, 0.6, "cpu") is None  # CPU keeps its defaults
    assert memory_budget.budget_bytes(None, None, "cuda") is None


def test_over_budget_names_the_stage_the_excess_and_the_remedies():
    gib = 2 ** 30
    assert memory_budget.over_budget("thinker", 36 * gib, 36 * gib) is None
    assert memory_budget.over_budget("thinker", 37 * gib, None) is None  # no budget
    assert memory_budget.over_budget("thinker", None, 36 * gib) is None  # no CUDA
    note = memory_budget.over_budget("thinker", 37 * gib, 36 * gib)
    assert "'thinker'" in note and "1.00 GiB over its budget of 36.00 GiB" in note
    assert "max_graph_context" in note
