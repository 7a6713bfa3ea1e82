"""FP8 (e4m3) weights for a diffusion stage's transformer (the option quantization: fp8,
omni/engines/diffusion/quantize.py): on the tiny random Qwen-Image loaded by the real
adapter, the blocks' linear weights turn float8 and the rest keeps the model's dtype, the
transformer's output and the image for one seed stay within a bound of the full-precision
twin's, and a bad value fails the load naming the choices."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from unit import diffusion_runs

from omni.engines.base import EngineLoadError
from omni.engines.diffusion.engine import DiffusionEngine
from omni.engines.quantization.fp8 import FP8, FP8Linear
from omni.fixtures.tiny_models import ensure_tiny_model
from omni.models import build_denoiser

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(ensure_tiny_model("qwen_image", tmp_path_factory.getbasetemp() / "models"))


def _engine(model_dir: str, **options) -> DiffusionEngine:
    denoiser = build_denoiser("qwen_image", model_dir=model_dir, device="cpu", dtype="auto",
                              options={})
    return DiffusionEngine(denoiser, options)


@pytest.fixture(scope="module")
def engines(model_dir):
    return _engine(model_dir), _engine(model_dir, quantization="fp8")


def _image(engine: DiffusionEngine, seed: int) -> np.ndarray:
    return diffusion_runs.image(engine, "a red fox in the snow", {"size": "32x32", "steps": 4, "seed": seed})


def test_the_blocks_weights_are_fp8_and_the_rest_keeps_its_dtype(engines):
    plain, fp8 = engines
    transformer = fp8.denoiser.pipe.transformer
    linears = [m for block in transformer.transformer_blocks for m in block.modules()
               if isinstance(m, nn.Linear | FP8Linear)]
    assert linears and all(type(m) is FP8Linear and m.weight.dtype == FP8 for m in linears)
    assert fp8.info()["quantization"] == "fp8"
    assert fp8.info()["quantized_weights"] == len(linears)
    # the embedders and the final projection: the model's dtype, as FP8 releases keep them
    for outside in (transformer.img_in, transformer.txt_in, transformer.proj_out):
        assert type(outside) is nn.Linear and outside.weight.dtype == torch.float32
    assert "quantization" not in plain.info()
    size = [sum(p.numel() * p.element_size() for p in e.denoiser.pipe.transformer.parameters())
            for e in engines]
    assert size[1] < 0.5 * size[0]  # fp32 -> fp8 blocks; scales and the rest in fp32


def test_the_transformers_output_is_within_e4m3s_rounding(engines):
    plain, fp8 = (e.denoiser.pipe.transformer for e in engines)
    generator = torch.Generator().manual_seed(0)
    # a 4x4 latent grid of 2x2 patches: 16 image tokens, 7 text tokens
    inputs = dict(hidden_states=torch.randn(1, 16, 64, generator=generator),
                  encoder_hidden_states=torch.randn(1, 7, 16, generator=generator),
                  encoder_hidden_states_mask=torch.ones(1, 7, dtype=torch.long),
                  timestep=torch.tensor([0.6]), img_shapes=[[(1, 4, 4)]], return_dict=False)
    with torch.no_grad():
        want, got = plain(**inputs)[0], fp8(**inputs)[0]
    assert want.std() > 0.1  # an output that varies
    error = float((got - want).norm() / want.norm())
    # measured on CPU when written: 0.3 % (the residual stream carries the unquantized
    # embedders' output past the two blocks); e4m3 rounds each matmul by ~2-3 %
    assert 0 < error < 0.05, error


def test_the_image_for_a_seed_stays_within_the_pixel_bound(engines):
    plain, fp8 = engines
    want, got = _image(plain, seed=3), _image(fp8, seed=3)
    # an image that is not flat, and one that depends on the seed: a real comparison
    assert want.std() > 5 and len(np.unique(want)) > 50
    assert np.abs(_image(plain, seed=4) - want).mean() > 5
    diff = np.abs(got - want)
    # measured on CPU when written: mean 0.035, max 2 levels of 255
    assert diff.mean() < 1.0 and diff.max() <= 8, (diff.mean(), diff.max())


def test_a_bad_value_fails_the_load(model_dir):
    with pytest.raises(EngineLoadError, match="quantization must be one of none, fp8"):
        _engine(model_dir, quantization="int4")
    assert "quantization" not in _engine(model_dir, quantization="none").info()
