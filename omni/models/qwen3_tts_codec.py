"""Qwen3-TTS's Code2Wav as a stage of its own: the split layout's code2wav stage.

The release's ``speech_tokenizer/`` (qwen-tts's 12 Hz tokenizer) loaded alone, its
decoder driven by the generation engine as Qwen3-Omni's code2wav is: codes stream in from
the talker stage (omni/models/qwen3_tts.py ``Qwen3TTSTalkerRunner``), each chunk decoded
with up to ``left_context`` earlier frames whose samples are dropped (the runner is
Qwen3-Omni's ``Code2WavRunner``; options chunk_frames, first_chunk_frames, chunk_growth,
left_context, complete_chunk_frames). The decoder is causal and gives exactly 1920
samples a frame (no look-ahead tail), so chunks join without a gap. A Base release's
in-context clone: the talker sends the reference's codes beside a sentence's first codes
(``"context"``), and the engine decodes them as that sentence's left context, in place of
the previous sentence's frames (omni/engines/generation/request.py).

Runs in the ``qwen3-tts`` environment (``env: qwen3-tts``), like the talker.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from omni.engines.base import EngineLoadError
from omni.models.code2wav_stack import conv_stack, conv_stack_frames, run_conv_stack
from omni.models.qwen3_omni import Code2WavRunner, _is_random

log = logging.getLogger("omni.models.qwen3_tts")

MASK_LENGTHS = 32  # lengths whose masks are kept: a stream's chunks take a few
MASK_UPTO = 1024  # frames: a longer call (a whole sentence) builds its masks each time


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def stage_torch_dtype(dtype: str | None, device: str) -> torch.dtype:
    """A Qwen3-TTS stage's dtype option as torch's: auto is bf16 on a GPU, else float32."""
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype not in _DTYPES:
        raise EngineLoadError(f"qwen3_tts: unknown dtype {dtype!r}; use auto, "
                              f"{', '.join(_DTYPES)}")
    return _DTYPES[dtype]


class CachedMaskDecoder:
    """qwen-tts's Code2Wav decoder (codes (B, groups, T) -> audio (B, 1, T * 1920)), its
    forward with the pre-transformer's attention masks built once per length.

    Why: the decoder's own forward gives its pre-transformer no mask, so the model passes
    position ids to transformers' mask builders (4.57), which then treat every call as
    possibly packed sequences and build both masks through vmap each time: 5-8 ms of host
    work a call on the dev VM whatever the batch, and the largest part of the code2wav
    stage's Python under load. Each row is one sequence, so the masks depend on the length
    alone and are the same without the packing check: built by transformers' own
    create_*_mask once per (length, dtype, device) and handed in as the dict the model
    takes ("may already have been prepared"). The rest mirrors the decoder's forward. Both
    follow the qwen3-tts environment's pins (qwen-tts 0.1.1, transformers 4.57.3: the mask
    builders' arguments are 4.57's); tests/http/test_qwen3_tts_gpu_paths.py checks the
    audio is the decoder's own, bit for bit."""

    def __init__(self, decoder: Any) -> None:
        self.decoder = decoder
        self.config = decoder.config
        self.total_upsample = decoder.total_upsample
        self._masks: OrderedDict[tuple, dict[str, Any]] = OrderedDict()
        self.masks_built = 0
        self.own_masks = False  # the builders refused our arguments: the model builds its own

    def parameters(self) -> Any:
        return self.decoder.parameters()

    def __call__(self, codes: torch.Tensor, skip_frames: int = 0) -> torch.Tensor:
        """codes (B, groups, T) -> audio (B, 1, (T - skip_frames) * 1920): the conv stack
        starts skip_frames in (see Qwen3TTSCode2Wav.stack_context_frames)."""
        dec = self.decoder
        if codes.shape[1] != self.config.num_quantizers:
            raise ValueError(f"Expected {self.config.num_quantizers} layer of codes, "
                             f"got {codes.shape[1]}")
        hidden = dec.pre_conv(dec.quantizer.decode(codes)).transpose(1, 2)
        hidden = dec.pre_transformer(inputs_embeds=hidden,
                                     attention_mask=self._masks_for(hidden)).last_hidden_state
        return run_conv_stack(dec, hidden.permute(0, 2, 1)[..., skip_frames:])

    def _masks_for(self, hidden: torch.Tensor) -> dict[str, Any] | None:
        """The pre-transformer's masks for a call of hidden's length (B, T, width); None:
        the model builds them itself (another transformers than the pinned one)."""
        if self.own_masks:
            return None
        key = (hidden.shape[1], hidden.dtype, hidden.device)
        masks = self._masks.get(key)
        if masks is None:
            try:
                masks = self._build_masks(hidden[:1])
            except TypeError as e:  # the builders' arguments changed (transformers 5.x)
                log.warning("Qwen3-TTS Code2Wav: cannot build its attention masks once per "
                            "length (%s); the model builds them on every call, which is "
                            "slower: rebuild the qwen3-tts environment from its pins "
                            "(scripts/install_qwen3_tts_env.sh)", e)
                self.own_masks = True
                return None
            if key[0] <= MASK_UPTO:
                self._masks[key] = masks
                while len(self._masks) > MASK_LENGTHS:
                    self._masks.popitem(last=False)
        else:
            self._masks.move_to_end(key)
        return masks

    def _build_masks(self, embeds: torch.Tensor) -> dict[str, Any]:
        from transformers.masking_utils import (
            create_causal_mask,
            create_sliding_window_causal_mask,
        )

        model = self.decoder.pre_transformer
        args = {"config": model.config, "input_embeds": embeds, "attention_mask": None,
                "cache_position": torch.arange(embeds.shape[1], device=embeds.device),
                "past_key_values": None, "position_ids": None}
        self.masks_built += 1
        masks = {"full_attention": create_causal_mask(**args)}
        if model.has_sliding_layers:
            masks["sliding_attention"] = create_sliding_window_causal_mask(**args)
        return masks


class Qwen3TTSCode2Wav:
    """The decoder of a Qwen3-TTS release's speech tokenizer, shaped as Code2WavRunner
    reads a code2wav: codes (B, groups, T) -> (B, T * samples_per_frame) float32."""

    tail_samples = 0  # causal convolutions: every frame's samples are known at once

    def __init__(self, codec: Any, device: str, model_dir: str) -> None:
        self.module = codec.model.decoder  # the torch module (fused_snake swaps its layers)
        self.decoder = CachedMaskDecoder(self.module)
        self.model_dir = model_dir
        self.random_weights = _is_random(Path(model_dir))
        self.dtype = next(self.decoder.parameters()).dtype
        config = codec.model.config.decoder_config
        # the pre-transformer's reach (sliding-window layers); the causal convolutions
        # add a few frames more
        self.receptive_field_frames = int(config.num_hidden_layers) * (
            int(config.sliding_window) - 1)
        self.num_quantizers = int(config.num_quantizers)
        self.codebook_size = int(config.codebook_size)
        self.samples_per_frame = int(codec.get_decode_upsample_rate())
        # frames before a kept frame that its samples read through the conv stack (10 in
        # the release): the stack of a chunk decoded after 25 frames of context (for the
        # pre-transformer) runs over the last 10 of them, with the same samples out
        self.stack_context_frames = conv_stack_frames(conv_stack(codec.model.decoder),
                                                      self.samples_per_frame)
        self.sample_rate = int(codec.get_output_sample_rate())
        self.device = torch.device(device)

    def decode(self, codes: torch.Tensor, skip_frames: int = 0) -> torch.Tensor:
        """codes (B, groups, T) -> (B, (T - skip_frames) * samples_per_frame) float32: the
        samples from frame skip_frames on, exact where skip_frames leaves each kept frame
        stack_context_frames before it."""
        with torch.inference_mode():
            wav = self.decoder(codes.to(self.device, torch.long).clamp(min=0), skip_frames)
        return wav[:, 0].float()

    def output_samples(self, frames: int) -> int:
        return frames * self.samples_per_frame

    def context_start(self, left_context: int) -> int:
        return left_context * self.samples_per_frame


def build_qwen3_tts_code2wav_runner(*, model_dir: str, device: str, dtype: str,
                                    options: dict[str, Any]) -> Code2WavRunner:
    try:
        from qwen_tts import Qwen3TTSTokenizer
    except ImportError as e:
        raise EngineLoadError("qwen3_tts_code2wav: needs the 'qwen-tts' package: run the "
                              "stage in its environment (env: qwen3-tts)") from e
    path = Path(model_dir) / "speech_tokenizer"
    try:
        # the stage's dtype (bf16 on a GPU), as qwen-tts's own pipeline loads its speech
        # tokenizer with the talker's: left to from_pretrained it was float32, and the
        # decodes beside the talker on one GPU took its steps from 14.0 to 24.3 ms at c=64
        # (H100, bench/results/qwen3-tts-gpu.md)
        codec = Qwen3TTSTokenizer.from_pretrained(str(path),
                                                  dtype=stage_torch_dtype(dtype, device))
    except (OSError, ValueError, TypeError) as e:
        raise EngineLoadError(f"qwen3_tts_code2wav: cannot load {path}: {e}") from e
    codec.model.to(device).eval()
    return Qwen3TTSCode2WavRunner(Qwen3TTSCode2Wav(codec, device, model_dir), options)


class Qwen3TTSCode2WavRunner(Code2WavRunner):
    """Qwen3-Omni's code2wav runner over Qwen3-TTS's decoder."""

    # padded calls on a GPU: first audio p50 at c=8 0.142 vs 0.168 s and 0.192 vs 0.274 s
    # unpadded, audio-s/s within the runs' spread (two H100s, bench/results/qwen3-tts-gpu.md)
    FIXED_SHAPES_ON_GPU = True
    # fused SnakeBeta on a GPU: 167 -> 142 ms a c=64 call (H100, qwen3-tts-gpu.md)
    FUSED_SNAKE_ON_GPU = True

    def info(self) -> dict[str, Any]:
        return {**super().info(), "model": "qwen3_tts_code2wav"}
