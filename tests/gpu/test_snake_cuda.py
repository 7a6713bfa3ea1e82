"""FusedSnake's compiled kernel (omni/models/snake.py) on a GPU: one compile serves every
batch, channel count and length. In float32 it matches transformers' Qwen3OmniMoeSnakeBeta
in eager; in bf16 it computes in float32 and rounds once, so it is held to a float64
reference from the same bf16 inputs and a, 1/b: within one bf16 unit in the last place
(eager bf16 rounds every op, and differs from both by up to ~2 units: not a bound to test)."""

from __future__ import annotations

import torch

from omni.models.snake import FusedSnake

SHAPES = ((1, 37), (3, 1920), (64, 4800))


def _snake(channels: int, gen: torch.Generator) -> torch.nn.Module:
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeSnakeBeta,
    )

    snake = Qwen3OmniMoeSnakeBeta(channels)
    with torch.no_grad():
        snake.alpha.copy_(0.5 * torch.randn(channels, generator=gen))
        snake.beta.copy_(0.5 * torch.randn(channels, generator=gen))
    return snake


def test_the_compiled_snake_matches_eager_in_float32():
    gen = torch.Generator().manual_seed(0)
    for channels in (96, 768):
        ref = _snake(channels, gen).to("cuda")
        fused = FusedSnake(ref)
        for batch, length in SHAPES:
            x = torch.randn(batch, channels, length, generator=gen).to("cuda")
            with torch.inference_mode():
                want, got = ref(x), fused(x)
            assert got.shape == want.shape and want.abs().max() > 0
            assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()


def test_the_compiled_snake_rounds_once_in_bf16():
    gen = torch.Generator().manual_seed(1)
    for channels in (96, 768):
        fused = FusedSnake(_snake(channels, gen).to("cuda", torch.bfloat16))
        a, inv_b = fused.a.double(), fused.inv_b.double()
        for batch, length in SHAPES:
            x = torch.randn(batch, channels, length, generator=gen).to("cuda", torch.bfloat16)
            with torch.inference_mode():
                got = fused(x)
            assert got.dtype == torch.bfloat16
            x64 = x.double()
            ref = x64 + inv_b * torch.sin(x64 * a) ** 2
            ulp = 2.0 ** (torch.floor(torch.log2(ref.abs().clamp(min=1e-30))) - 7)
            assert ((got.double() - ref).abs() <= ulp + 1e-6).all(), (channels, batch, length)
