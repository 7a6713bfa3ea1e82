"""The convolution stack of the Qwen3 Code2Wav decoders (Qwen3-Omni's code2wav in
transformers, Qwen3-TTS's speech tokenizer decoder in qwen-tts): the layers after the
pre-transformer, which upsample 12.5 frames a second to 24 k samples, and how far back
and ahead each output sample reads (the streamed chunks' context and look-ahead)."""

from __future__ import annotations

from typing import Any

import torch


def conv_stack(module) -> list[tuple[str, Any]]:
    """The layers after the transformer, in forward order, as ("causal", conv),
    ("trans", conv) or ("res", unit) entries; pointwise layers are skipped. By class name:
    transformers' Qwen3-Omni code2wav (Qwen3OmniMoeCausalConvNet, ...) and qwen-tts's
    Qwen3-TTS decoder (Qwen3TTSTokenizerV2CausalConvNet, ...) name them alike and their
    convolutions keep the same attributes (kernel_size: the dilated reach, stride,
    left_pad)."""
    out: list[tuple[str, Any]] = []

    def walk(mod) -> None:
        name = type(mod).__name__
        if name.endswith("CausalTransConvNet"):
            out.append(("trans", mod))
        elif name.endswith("CausalConvNet"):
            out.append(("causal", mod))
        elif name.endswith("ResidualUnit"):
            out.append(("res", mod))
        else:
            for child in mod.children():
                walk(child)

    for blocks in module.upsample:
        for block in blocks:
            walk(block)
    for block in module.decoder:
        walk(block)
    return out


def conv_stack_frames(stack: list[tuple[str, Any]], samples_per_frame: int) -> int:
    """Frames before frame t that the conv stack (conv_stack's list) reads for frame t's
    first sample: a decode whose stack starts that many frames before the first frame kept
    gives that frame's samples exactly as a stack over all frames would (causal
    convolutions)."""
    t = 10_000
    return t - min_input_index(stack, t * samples_per_frame)


def run_conv_stack(module, hidden: torch.Tensor) -> torch.Tensor:
    """A Code2Wav decoder's layers after its pre-transformer: (B, width, T) at the frame
    rate -> (B, 1, samples) in [-1, 1] (the decoders' own forward from there on)."""
    for blocks in module.upsample:
        for block in blocks:
            hidden = block(hidden)
    for block in module.decoder:
        hidden = block(hidden)
    return hidden.clamp(min=-1, max=1)


def min_input_index(stack: list[tuple[str, Any]], j: int) -> int:
    """Smallest input (frame-rate) index that output sample j of the conv stack reads."""
    for kind, mod in reversed(stack):
        if kind == "causal":  # stride 1, left pad kernel-1: out[j] reads in[j-k+1 .. j]
            assert mod.stride == 1
            j -= mod.kernel_size - 1
        elif kind == "res":  # x + conv2(conv1(x)), conv2 is 1x1
            j -= mod.conv1.kernel_size - 1
        else:  # ConvTranspose(K, s) with the first K-s outputs trimmed
            k, s = mod.conv.kernel_size[0], mod.conv.stride[0]
            j = (j + mod.left_pad - k) // s + 1
    return j


def max_input_index(stack: list[tuple[str, Any]], j: int) -> int:
    """Largest input index that output sample j reads (the decoder's look-ahead)."""
    for kind, mod in reversed(stack):
        if kind == "trans":  # full[n] reads in[i] with i*s <= n
            j = (j + mod.left_pad) // mod.conv.stride[0]
    return j
