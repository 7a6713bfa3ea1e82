"""The prefill budget beside decodes from a measured step-time model (omni/engines/ar/
step_budget.py): the fit, the measurement on a real engine, and the cap it sets."""

from __future__ import annotations

import pytest

from omni.engines.ar.engine import AREngine
from omni.engines.ar.step_budget import StepModel, fit
from omni.engines.base import EngineLoadError
from omni.fixtures import build_tiny_qwen3


def test_fit_recovers_a_line_and_never_goes_negative():
    model = fit([(128, 12.0), (512, 24.0), (1024, 40.0)])
    assert model.per_token_ms == pytest.approx(0.03125, rel=0.02)
    assert model.fixed_ms == pytest.approx(8.0, abs=0.5)
    assert model.tokens_within(50.0) == pytest.approx(1344, abs=40)
    flat = fit([(128, 5.0), (512, 4.0)])  # noise: a step got faster with more tokens
    assert flat.per_token_ms == 0 and flat.fixed_ms == 4.5
    assert flat.tokens_within(5.0) > 10**6 and flat.tokens_within(4.0) == 0
    assert StepModel(60.0, 0.01).tokens_within(50.0) == 0  # the fixed part alone is over


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(build_tiny_qwen3(tmp_path_factory.mktemp("qwen3")))


def test_the_cap_comes_from_the_measured_steps(model_dir, caplog):
    engine = AREngine(model_dir, options={"max_batched_tokens": 256, "step_latency_ms": 1e6})
    model = engine.step_model
    assert model is not None and model.per_token_ms >= 0 and model.fixed_ms >= 0
    assert engine.info()["prefill_beside_decodes"] == 256  # a target no step reaches
    # a target no step meets: the smallest timed step (1/16 of 1024), never a few tokens
    # (prompts waiting beside decodes would crawl), and a warning that says why
    with caplog.at_level("WARNING", logger="omni.engines.ar.step_budget"):
        tight = AREngine(model_dir, options={"max_batched_tokens": 1024,
                                             "step_latency_ms": 1e-3})
    assert tight.info()["prefill_beside_decodes"] == 64 > tight.cache.block_size
    assert "the smallest timed step" in caplog.text
    # between the two: whole blocks the fitted line allows within the target
    target = model.fixed_ms + 100 * model.per_token_ms
    mid = AREngine(model_dir, options={"max_batched_tokens": 256, "step_latency_ms": target})
    cap = mid.info()["prefill_beside_decodes"]
    assert cap % 16 == 0 and 16 <= cap <= 256


def test_cpu_measures_nothing_by_default_and_an_explicit_cap_wins(model_dir):
    assert AREngine(model_dir).step_model is None
    fixed = AREngine(model_dir, options={"prefill_beside_decodes": 8, "step_latency_ms": 1e-3})
    assert fixed.step_model is None and fixed.info()["prefill_beside_decodes"] == 8
    with pytest.raises(EngineLoadError, match="step_latency_ms must be a positive number"):
        AREngine(model_dir, options={"step_latency_ms": "fast"})


def test_a_quoted_flag_is_refused_not_taken_as_true(model_dir):
    # bool("false") is True: a quoted value must fail the load, naming the option
    with pytest.raises(EngineLoadError, match="option chain_decode must be true or false"):
        AREngine(model_dir, options={"chain_decode": "false"})
