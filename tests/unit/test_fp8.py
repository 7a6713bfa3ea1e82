"""FP8 (e4m3) weights with per-channel scales (omni/engines/quantization/fp8.py, the AR option
quantization: fp8): the matmul's error against the full-precision one, the tiny Qwen3's
logits within a bound of its unquantized twin, fused projections, the engine option."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from omni.engines.ar.engine import AREngine
from omni.engines.ar.fused_projections import fuse_projections
from omni.engines.base import EngineLoadError, EngineRequest
from omni.engines.quantization.fp8 import FP8, FP8Linear, fp8_linear, quantize_layers, quantize_rows
from omni.fixtures import build_tiny_qwen3


def test_a_matmul_through_fp8_is_within_e4m3s_rounding():
    torch.manual_seed(0)
    # rows of very different magnitudes (1e-5 .. 10), as trained weights' channels can be
    w = torch.randn(96, 128) * torch.logspace(-5, 1, 96)[:, None]
    x = torch.randn(5, 7, 128)
    q, scale = quantize_rows(w)
    assert q.dtype == FP8 and scale.shape == (96,)
    got, want = fp8_linear(x, q, scale, None), F.linear(x, w)

    def error(out: torch.Tensor, rows: slice) -> float:
        return float((out - want)[..., rows].norm() / want[..., rows].norm())
    assert 0 < error(got, slice(None)) < 0.05  # 3 mantissa bits: ~2-3 %
    assert error(got, slice(0, 10)) < 0.05  # the smallest rows too: each has its own scale
    # one scale for the whole weight: the smallest rows fall below e4m3's range (zeros)
    flat = w.abs().max() / 448
    coarse = fp8_linear(x, (w / flat).to(FP8), flat.expand(96).contiguous(), None)
    assert error(coarse, slice(0, 10)) > 0.5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(build_tiny_qwen3(tmp_path_factory.mktemp("qwen3"), initializer_range=0.5))


def test_which_weights_turn_fp8(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    fuse_projections(model)  # as the engine does first: slices of one fused weight
    assert quantize_layers(list(model.model.layers)) == 4 * len(model.model.layers)
    layer = model.model.layers[0]
    assert type(layer.self_attn.o_proj) is FP8Linear
    assert layer.self_attn.q_proj.weight is layer.self_attn.v_proj.weight  # shared, fp8
    assert layer.self_attn.q_proj.weight.dtype == FP8
    assert model.lm_head.weight.dtype == torch.float32  # kept, as the embeddings


def test_real_weights_logits_stay_within_the_measured_bound():
    """SmolLM2-135M's real weights (the default server's): fp8 moved its logits by 14.7 %
    (relative norm) and kept the top token at 80 % of positions when this was written;
    bf16 moves them 2.9 % (97 %). A small model compounds e4m3's ~3 % per matmul over 30
    layers; the bounds below guard against regressions of the method, not the format."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from omni.models.smollm2 import ensure_smollm2

    path = ensure_smollm2()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    text = ["The capital of France is Paris, and the capital of Germany is Berlin.",
            "Water boils at one hundred degrees Celsius at sea level, which is why cooking"]
    ids = AutoTokenizer.from_pretrained(path)(text, return_tensors="pt", padding=True).input_ids
    with torch.no_grad():
        want = model(ids).logits
        fuse_projections(model)
        quantize_layers(list(model.model.layers))
        got = model(ids).logits
    error = float((got - want).norm() / want.norm())
    agree = float((got.argmax(-1) == want.argmax(-1)).float().mean())
    assert 0.01 < error < 0.2 and agree >= 0.75, (error, agree)


def _first_tokens(engine: AREngine, prompts: list[str]) -> list[int]:
    for i, p in enumerate(prompts):
        engine.add(EngineRequest(f"r{i}", {"prompt": p},
                                 {"temperature": 0, "max_tokens": 1, "ignore_eos": True}))
    first = {}
    while engine.has_work():
        for o in engine.step():
            assert o.error is None, o.error
            first.setdefault(o.request_id, o.data["token_ids"][0])
    return [first[f"r{i}"] for i in range(len(prompts))]


def test_the_engine_option(model_dir):
    from omni.models.smollm2 import ensure_smollm2

    prompts = ["Hello there", "A story about a robot", "One two three", "The sea is",
               "Why is the sky blue", "Tell me", "Numbers: 4 8 15", "Good morning to you"]
    real = str(ensure_smollm2())  # real weights: random ones amplify any rounding
    plain = AREngine(real)
    fp8 = AREngine(real, options={"quantization": "fp8"})
    weights = [sum(p.numel() * p.element_size() for p in e.lm.model.parameters())
               for e in (plain, fp8)]
    assert weights[1] < weights[0]
    want, got = _first_tokens(plain, prompts), _first_tokens(fp8, prompts)
    assert len(set(want)) >= 4  # the prompts' answers differ
    assert sum(a == b for a, b in zip(want, got, strict=True)) >= 6, (want, got)
    with pytest.raises(EngineLoadError, match="quantization must be one of none, fp8"):
        AREngine(model_dir, options={"quantization": "int3"})
