"""The talker's code-predictor loop (omni/models/qwen3_omni_predictor.py): the cache-free
form that CUDA graphs capture computes what the cached form does, padding rows included."""

from __future__ import annotations

import pytest
import torch

from omni.fixtures import ensure_tiny_model
from omni.models.predictor_kv import layer_step, one_pass, pass_tail, predict_static, supported
from omni.models.qwen3_omni_predictor import (
    PredictorGraphs,
    pick,
    predict_cached,
    predict_uncached,
)
from omni.models.qwen3_omni_talker import load_talker

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def talker(tmp_path_factory):
    d = ensure_tiny_model("qwen3_omni", cache_dir=tmp_path_factory.getbasetemp() / "models")
    lm, feed = load_talker(model_dir=str(d), device="cpu", dtype="auto")
    return lm.model.talker, feed


def _inputs(talker, batch: int, seed: int):
    model, feed = talker
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, model.config.text_config.hidden_size, generator=gen)
    first = model.get_input_embeddings()(torch.randint(0, 64, (batch,), generator=gen))
    draws = torch.rand(batch, feed.num_groups - 1, generator=gen)
    greedy = torch.tensor([i % 2 == 0 for i in range(batch)])
    return hidden, first, draws, greedy


@torch.inference_mode()
def test_static_kv_loop_equals_cached(talker):
    """predictor_kv.predict_static (its own buffers and layer step) = transformers' cache;
    the codes vary, so equal codes say something."""
    model, feed = talker
    args = _inputs(talker, 6, 1)
    codes, total = predict_cached(model.code_predictor, feed.cache_key, *args)
    codes2, total2 = predict_static(model.code_predictor, *args)
    assert len(set(codes.flatten().tolist())) > 3
    assert torch.equal(codes, codes2)
    torch.testing.assert_close(total, total2, rtol=1e-4, atol=1e-5)


@torch.inference_mode()
def test_static_kv_loop_over_the_engines_fused_projections(talker, tmp_path_factory):
    """As the AR engine serves the talker: its q/k/v and gate/up projections fused into one
    matmul each (omni/engines/ar/fused_projections.py); the static loop, pass tail included,
    still equals the unfused cached loop."""
    from omni.engines.ar.fused_projections import fuse_projections

    model, feed = talker
    args = _inputs(talker, 6, 2)
    codes, total = predict_cached(model.code_predictor, feed.cache_key, *args)
    d = ensure_tiny_model("qwen3_omni", cache_dir=tmp_path_factory.getbasetemp() / "models")
    fused = load_talker(model_dir=str(d), device="cpu", dtype="auto")[0].model.talker
    assert fuse_projections(fused.code_predictor) == 2 * len(fused.code_predictor.model.layers)
    codes2, total2 = predict_static(fused.code_predictor, *args)
    assert len(set(codes.flatten().tolist())) > 3
    assert torch.equal(codes, codes2)
    torch.testing.assert_close(total, total2, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("unit", ["layer", "pass"])
@torch.inference_mode()
def test_static_loop_compiles_without_graph_breaks(talker, unit):
    """What the talkers' graphs compile traces whole (fullgraph: a graph break raises) over
    batch sizes 1 to 8 and every pass: a size-dependent flag once split each layer step in
    two. And in at most 4 compiles a function (a fifth raises): past dynamo's limit of 8
    the rest ran eagerly, as a served H100 stage's layer step did (its rotary tables came in
    as views at each pass's offset). Dynamo's tracing only (the eager backend): inductor's
    kernels are the GPU test's."""
    model, feed = talker
    cp = model.code_predictor
    torch._dynamo.reset()
    compile_ = lambda fn: torch.compile(fn, dynamic=True, fullgraph=True, backend="eager")  # noqa: E731
    kwargs = ({"run": compile_(one_pass)} if unit == "pass"
              else {"step": compile_(layer_step), "tail": compile_(pass_tail)})
    try:
        with torch._dynamo.config.patch(recompile_limit=4, fail_on_recompile_limit_hit=True):
            _run_batches(talker, cp, feed, kwargs)
    finally:
        torch._dynamo.reset()


def _run_batches(talker, cp, feed, kwargs) -> None:
    for batch in (1, 2, 3, 8):
        args = _inputs(talker, batch, batch)
        codes, _ = predict_static(cp, *args, **kwargs)
        assert torch.equal(codes, predict_cached(cp, feed.cache_key, *args)[0])


@torch.inference_mode()
def test_uncached_loop_equals_cached(talker):
    model, feed = talker
    args = _inputs(talker, 5, 0)
    codes, total = predict_cached(model.code_predictor, feed.cache_key, *args)
    codes2, total2 = predict_uncached(model.code_predictor, *args)
    assert codes.shape == (5, feed.num_groups - 1)
    assert torch.equal(codes, codes2)
    torch.testing.assert_close(total, total2, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cached", [False, True], ids=["uncached", "kv-cached"])
@torch.inference_mode()
def test_static_buffers_pad_and_fall_back(talker, cached):
    model, feed = talker
    assert supported(model.code_predictor)
    graphs = PredictorGraphs(model.code_predictor, model.config.text_config.hidden_size,
                             feed.num_groups, torch.float32, torch.device("cpu"),
                             max_batch=8, capture=False,
                             kv_cache=cached)
    assert graphs.sizes == [1, 2, 4, 8]
    for batch in (3, 1, 8):  # 3 runs padded to 4; stale rows from a larger batch are zeroed
        args = _inputs(talker, batch, batch)
        codes, total = graphs.run(*args)
        want_codes, want_total = predict_cached(model.code_predictor, feed.cache_key, *args)
        assert torch.equal(codes, want_codes)
        torch.testing.assert_close(total, want_total, rtol=1e-4, atol=1e-5)
    assert graphs.run(*_inputs(talker, 9, 0)) is None  # past the largest: the caller's loop


def test_pick_greedy_and_sampled():
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 2.9]])
    greedy = torch.tensor([True, False])
    # row 1 samples: after top-p 0.8 only ids 0 and 2 remain; a low draw takes id 0
    assert pick(logits, torch.tensor([0.99, 0.01]), greedy).tolist() == [1, 0]
    assert pick(logits, torch.tensor([0.0, 0.99]), greedy).tolist() == [1, 2]
