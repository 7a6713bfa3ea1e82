"""The code predictor over its static KV cache (omni/models/predictor_kv.py) on a GPU, as the
talkers run it: captured in CUDA graphs with its layer step torch.compiled, float32 on the
tiny Qwen3-Omni fixture, its projections separate or fused as the AR engine fuses them.
Greedy codes equal transformers' cached loop run eagerly, padded batches included; the
codes vary, so equality says something."""

from __future__ import annotations

import pytest
import torch

from omni.fixtures import ensure_tiny_model
from omni.models.qwen3_omni_predictor import PredictorGraphs, predict_cached
from omni.models.qwen3_omni_talker import load_talker


@pytest.fixture(scope="module")
def talker(tmp_path_factory):
    d = ensure_tiny_model("qwen3_omni", cache_dir=tmp_path_factory.getbasetemp() / "models")
    lm, feed = load_talker(model_dir=str(d), device="cuda", dtype="float32")
    return lm.model.talker, feed


@pytest.fixture(scope="module")
def engine_fused(tmp_path_factory):
    """Another copy of the talker with the AR engine's fused q/k/v and gate/up projections,
    as the served talker stages run it."""
    from omni.engines.ar.fused_projections import fuse_projections

    d = ensure_tiny_model("qwen3_omni", cache_dir=tmp_path_factory.getbasetemp() / "models")
    model = load_talker(model_dir=str(d), device="cuda", dtype="float32")[0].model.talker
    assert fuse_projections(model.code_predictor) > 0
    return model


@pytest.mark.parametrize("fused", [False, True], ids=["separate", "engine-fused"])
@pytest.mark.parametrize("unit", ["eager", "layer", "pass"])
@torch.inference_mode()
def test_graphed_static_kv_loop_equals_the_cached_loop(talker, engine_fused, unit, fused):
    """unit: what torch.compile compiles (PredictorGraphs' compile_unit), or nothing. The
    served batch sizes (1-64) captured within dynamo's recompile limit: past it, a function
    runs eagerly from then on (a served stage's layer step did on torch 2.11) and would
    still give the same codes, so hitting it fails here."""
    model, feed = talker
    width = model.config.text_config.hidden_size
    cp = engine_fused.code_predictor if fused else model.code_predictor
    torch._dynamo.reset()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        graphs = PredictorGraphs(cp, width, feed.num_groups, torch.float32,
                                 torch.device("cuda"), max_batch=64, compiled=unit != "eager",
                                 kv_cache=True, compile_unit=unit)
    gen = torch.Generator(device="cuda").manual_seed(0)
    seen: set[int] = set()
    for batch in (3, 8, 1):
        hidden = torch.randn(batch, width, device="cuda", generator=gen)
        first = model.get_input_embeddings()(
            torch.randint(0, 64, (batch,), device="cuda", generator=gen))
        draws = torch.zeros(batch, feed.num_groups - 1, device="cuda")
        greedy = torch.ones(batch, dtype=torch.bool, device="cuda")
        codes, total = graphs.run(hidden, first, draws, greedy)
        want, want_total = predict_cached(model.code_predictor, feed.cache_key, hidden, first,
                                          draws, greedy)
        assert torch.equal(codes, want)
        torch.testing.assert_close(total, want_total, rtol=1e-4, atol=1e-4)
        seen.update(codes.flatten().tolist())
    assert len(seen) > 3
