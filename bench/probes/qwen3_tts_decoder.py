"""Qwen3-TTS's Code2Wav decoder alone: where a call's GPU time goes, and what fusing its
SnakeBeta activations (omni/models/snake.py) or compiling its whole convolution stack
buys.

Builds the release's speech tokenizer (omni/fixtures/qwen3_tts_release.py's config, random
weights) on the device, then for each (batch, frames): the decoder as the code2wav stage
runs it (CachedMaskDecoder), the same with fused SnakeBeta (and with cuDNN's benchmark mode
picking its convolution algorithms), and with the upsampling and
convolution stack under torch.compile (dynamic shapes); median ms of --repeat calls after
warm-up, and the variants' largest difference from the first (--compile-stack adds the
compiled stack). A profile of the fused variant's (the served decoder's) largest call lists
its top kernels. Runs in the qwen3-tts environment:

    python bench/probes/qwen3_tts_decoder.py --batch 8,64 --frames 28,75

First H100 call (2026-12-07): the three variants did not print one row within 300 s (the
compiled stack's compiles), so the stack is opt-in.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from omni.models.qwen3_tts_codec import CachedMaskDecoder  # noqa: E402
from omni.models.snake import fuse_snakes  # noqa: E402


def build_decoder(device: str, dtype: torch.dtype) -> torch.nn.Module:
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model

    from omni.fixtures.qwen3_tts_release import speech_tokenizer_config
    from omni.fixtures.tiny_qwen3_tts import _varied_codec

    config = Qwen3TTSTokenizerV2Config(**speech_tokenizer_config())
    with torch.device(device):
        model = Qwen3TTSTokenizerV2Model(config)
    _varied_codec(model)
    return model.decoder.to(dtype).eval()


class CompiledStack(CachedMaskDecoder):
    """The decoder with its upsampling and convolution stack as one compiled function."""

    def __init__(self, decoder: torch.nn.Module) -> None:
        super().__init__(decoder)
        self._stack = torch.compile(self._run_stack, dynamic=True)

    def _run_stack(self, hidden: torch.Tensor) -> torch.Tensor:
        for blocks in self.decoder.upsample:
            for block in blocks:
                hidden = block(hidden)
        for block in self.decoder.decoder:
            hidden = block(hidden)
        return hidden.clamp(min=-1, max=1)

    def __call__(self, codes: torch.Tensor) -> torch.Tensor:
        dec = self.decoder
        hidden = dec.pre_conv(dec.quantizer.decode(codes)).transpose(1, 2)
        hidden = dec.pre_transformer(inputs_embeds=hidden,
                                     attention_mask=self._masks_for(hidden)).last_hidden_state
        return self._stack(hidden.permute(0, 2, 1))


class CudnnBenchmarked:
    """A decoder called with cuDNN's benchmark mode on: each new call shape times cuDNN's
    convolution algorithms once and keeps the fastest (off, it takes its heuristic's
    pick); the code2wav stage's padded calls come in a few shapes, all met at load."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def __call__(self, codes: torch.Tensor) -> torch.Tensor:
        before = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = True
        try:
            return self.fn(codes)
        finally:
            torch.backends.cudnn.benchmark = before


def timed(fn, codes: torch.Tensor, repeat: int) -> tuple[float, torch.Tensor]:
    with torch.inference_mode():
        out = fn(codes)
        for _ in range(2):
            fn(codes)
        torch.cuda.synchronize()
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            fn(codes)
            torch.cuda.synchronize()
            times.append(1000 * (time.perf_counter() - t))
    return statistics.median(times), out


def profile(fn, codes: torch.Tensor) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    with torch.inference_mode(), prof(activities=[ProfilerActivity.CUDA]) as p:
        fn(codes)
        torch.cuda.synchronize()
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", default="8,64")
    ap.add_argument("--frames", default="28,75")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--compile-stack", action="store_true",
                    help="add the compiled stack (its compile outlasted a 300 s call on an "
                    "H100 before the first row printed)")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    base = build_decoder("cuda", dtype)
    fused_model = copy.deepcopy(base)
    print(f"fused {fuse_snakes(fused_model)} SnakeBeta modules")
    variants = {"eager": CachedMaskDecoder(base), "fused-snake": CachedMaskDecoder(fused_model),
                "fused+cudnn-bench": CudnnBenchmarked(CachedMaskDecoder(fused_model))}
    t = time.perf_counter()
    if args.compile_stack:
        variants["compiled-stack"] = CompiledStack(base)
    print("| batch | frames | " + " | ".join(f"{k} ms" for k in variants) + " | max diff |")
    print("|---:|---:|" + "---:|" * (len(variants) + 1))
    shapes = [(b, f) for b in map(int, args.batch.split(",")) for f in map(int, args.frames.split(","))]
    for b, f in shapes:
        codes = torch.randint(0, 2048, (b, 16, f), device="cuda")
        times, outs = [], []
        for fn in variants.values():
            ms, out = timed(fn, codes, args.repeat)
            times.append(ms)
            outs.append(out.float())
        diff = max((o - outs[0]).abs().max().item() for o in outs[1:])
        print(f"| {b} | {f} | " + " | ".join(f"{ms:.2f}" for ms in times) + f" | {diff:.4f} |",
              flush=True)
    print(f"({time.perf_counter() - t:.0f} s for all shapes, each variant's compiles in its "
          "warm-up calls)")
    b, f = shapes[-1]
    profile(variants["fused-snake"], torch.randint(0, 2048, (b, 16, f), device="cuda"))


if __name__ == "__main__":
    main()
