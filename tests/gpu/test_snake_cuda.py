"""FusedSnake's compiled kernel (omni/models/snake.py) on a GPU against transformers'
Qwen3OmniMoeSnakeBeta in eager: one compile serves every batch, channel count and length,
within bf16 rounding (inductor computes in float32 and rounds once; eager rounds each op)."""

from __future__ import annotations

import torch

from omni.models.snake import FusedSnake


def test_the_compiled_snake_matches_eager_across_shapes():
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeSnakeBeta,
    )

    gen = torch.Generator().manual_seed(0)
    for channels in (96, 768):
        snake = Qwen3OmniMoeSnakeBeta(channels)
        with torch.no_grad():
            snake.alpha.copy_(0.5 * torch.randn(channels, generator=gen))
            snake.beta.copy_(0.5 * torch.randn(channels, generator=gen))
        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
            ref = snake.to("cuda", dtype)
            fused = FusedSnake(ref)
            for batch, length in ((1, 37), (3, 1920), (64, 4800)):
                x = torch.randn(batch, channels, length, generator=gen).to("cuda", dtype)
                with torch.inference_mode():
                    want = ref(x).float()
                    got = fused(x).float()
                assert got.shape == want.shape
                scale = want.abs().max().item()
                assert scale > 0
                assert (got - want).abs().max().item() <= tol * max(scale, 1.0), (
                    channels, dtype, batch, length)
