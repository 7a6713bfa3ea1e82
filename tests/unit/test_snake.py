"""FusedSnake (omni/models/snake.py) against the SnakeBeta modules it replaces: the tiny
Qwen3-Omni code2wav (transformers' Qwen3OmniMoeSnakeBeta inside its decoder blocks).
On CPU FusedSnake runs eager's operations (equal); tests/gpu/test_snake_cuda.py bounds the
compiled kernel against eager on a GPU."""

from __future__ import annotations

import copy

import torch

from omni.models.snake import FusedSnake, fuse_snakes
from tests.unit.code2wav_runs import code2wav, random_codes


def _varied_snakes(model: torch.nn.Module) -> int:
    """Random alpha and beta: the release's are trained, the fixture's zeros would hide a
    swapped exp or a dropped 1/b."""
    count = 0
    gen = torch.Generator().manual_seed(0)
    for module in model.modules():
        if type(module).__name__.endswith("SnakeBeta"):
            with torch.no_grad():
                module.alpha.copy_(0.5 * torch.randn(module.alpha.shape, generator=gen))
                module.beta.copy_(0.5 * torch.randn(module.beta.shape, generator=gen))
            count += 1
    return count


def test_fused_snakes_give_the_decoders_audio(tmp_path_factory):
    c2w = code2wav(tmp_path_factory)
    model = copy.deepcopy(c2w.module)
    assert _varied_snakes(model) > 0
    fused = copy.deepcopy(model)
    swapped = fuse_snakes(fused)
    assert swapped == sum(type(m).__name__.endswith("SnakeBeta") for m in model.modules())
    assert not any(type(m).__name__.endswith("SnakeBeta") for m in fused.modules())
    assert sum(isinstance(m, FusedSnake) for m in fused.modules()) == swapped
    codes = torch.stack([random_codes(12, seed) for seed in (1, 2)])
    with torch.inference_mode():
        want, got = model(codes), fused(codes)
    assert want.abs().max() > 0 and want.std() > 0  # the fixture's audio varies
    assert torch.equal(got, want)


def test_a_fused_snake_is_the_modules_function():
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeSnakeBeta,
    )

    snake = Qwen3OmniMoeSnakeBeta(6)
    _varied_snakes(snake)
    x = torch.randn(3, 6, 50, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        assert torch.equal(FusedSnake(snake)(x), snake(x))


def test_a_kernel_that_does_not_compile_leaves_the_eager_path(monkeypatch, caplog):
    """Where torch.compile fails (no Triton, a compiler error) the activations run eagerly,
    with one warning naming the option, and later calls do not try again."""
    from omni.models import snake as module

    calls = []

    def broken():
        calls.append(1)
        raise RuntimeError("triton not found")

    monkeypatch.setattr(module, "_kernel", broken)
    monkeypatch.setattr(module, "_eager_only", False)
    x, a, inv_b = torch.randn(2, 3, 8), torch.rand(1, 3, 1), torch.rand(1, 3, 1)
    with caplog.at_level("WARNING", logger="omni.models.snake"):
        first, second = module._fused(x, a, inv_b), module._fused(x, a, inv_b)
    assert torch.equal(first, module._snake(x, a, inv_b)) and torch.equal(second, first)
    assert len(calls) == 1
    assert [r.message for r in caplog.records if "fused_snake: false" in r.message]
