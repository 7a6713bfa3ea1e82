"""Qwen3-Omni-MoE adapter: the model quirks of the code2wav stage live here.

Quirks (see reference/models.md 2a):
- A release is ONE combined checkpoint (``thinker.*``, ``talker.*``, ``code2wav.*`` keys).
  ``Qwen3OmniMoeCode2Wav.from_pretrained(combined_dir)`` does not strip the ``code2wav.``
  prefix: every key is UNEXPECTED, every weight MISSING, and the model silently keeps
  random weights (only a log table says so). `load_code2wav` reads the code2wav tensors
  itself and loads them with ``strict=True``.
- The output sample rate is not in the config: it is 24 kHz (12.5 codec frames/s, 80 ms
  per frame; OpenVINO's Qwen3-Omni notes, models.md 2a). 1920 samples/frame * 12.5 = 24000.
- The decoder is not strictly causal: every ``CausalTransConvNet`` of kernel 2r / stride r
  looks one input step ahead and trims its last step, so decoding T frames gives
  ``T * samples_per_frame - tail_samples`` samples (1920 * T - 555 for the release's
  rates). transformers' ``chunked_decode`` decodes chunks independently and concatenates
  them, so each chunk boundary loses those tail samples; `decode_chunk` mirrors it.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from omni.engines.base import EngineLoadError, flag_option
from omni.fixtures.release_files import FIXTURE_MARKER
from omni.models.checkpoint_parts import prefixed_tensors
from omni.models.code2wav_shapes import CallShapes, decode_padded, prepare_shapes
from omni.models.code2wav_stack import (
    conv_stack,
    conv_stack_frames,
    max_input_index,
    min_input_index,
    run_conv_stack,
)

log = logging.getLogger(__name__)

# Not in the config: Qwen3-Omni's codec runs at 12.5 frames/s and the vocoder emits 24 kHz
# (models.md 2a, from OpenVINO's Qwen3-Omni docs); 1920 samples/frame * 12.5 = 24000.
SAMPLE_RATE = 24000
CODE2WAV_PREFIX = "code2wav."
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


@dataclass
class Code2Wav:
    """A loaded Qwen3-Omni code2wav: codec codes (B, NQ, T) -> 24 kHz waveform."""

    module: Any  # Qwen3OmniMoeCode2Wav, eval, no grad
    config: Any
    device: torch.device
    dtype: torch.dtype
    model_dir: str = ""
    random_weights: bool = False
    num_quantizers: int = field(init=False)
    codebook_size: int = field(init=False)
    samples_per_frame: int = field(init=False)
    sample_rate: int = field(init=False, default=SAMPLE_RATE)
    receptive_field_frames: int = field(init=False)
    tail_samples: int = field(init=False)
    stack_context_frames: int = field(init=False)

    def __post_init__(self) -> None:
        c = self.config
        self.num_quantizers = int(c.num_quantizers)
        self.codebook_size = int(c.codebook_size)
        self.samples_per_frame = int(math.prod(list(c.upsample_rates) + list(c.upsampling_ratios)))
        self.sample_rate = SAMPLE_RATE
        # Left context (frames) that fully determines a frame's samples:
        # - the pre-transformer: every layer is sliding-window attention (layer_types), a
        #   query sees itself + sliding_window-1 earlier frames, so L layers reach back
        #   L * (sliding_window - 1) frames (RoPE is relative: absolute offsets do not matter);
        # - the conv stack (kernel sizes / dilations / strides read from the built module,
        #   they are hard-coded in transformers, not in the config): walk it backwards from
        #   the first sample of a frame to the earliest frame it reads.
        # With the release config (8 layers, window 72) this is 8*71 + 10 = 578 frames:
        # exact streaming would need 46 s of context, so streaming uses a shorter one
        # (chunked_decode's default is 25) and is approximate. The bound is strict; on the
        # tiny fixture (1 layer: 71 + 10 = 81) 75 frames already match to float noise.
        stack = conv_stack(self.module)
        spf = self.samples_per_frame
        conv_frames = conv_stack_frames(stack, spf)
        attn = sum(int(c.sliding_window) - 1 for kind in c.layer_types
                   if kind == "sliding_attention")
        if any(kind != "sliding_attention" for kind in c.layer_types):
            attn = 1 << 30  # full attention: unbounded (not the case in any known release)
        self.receptive_field_frames = attn + conv_frames
        # samples a T-frame decode is short of T*spf (the look-ahead trimmed at the end)
        t = 10_000
        last = t * spf - 1
        while max_input_index(stack, last) >= t:
            last -= 1
        self.tail_samples = t * spf - 1 - last
        # the conv stack's reach before the first sample a chunk keeps (context_start)
        self.stack_context_frames = t - min_input_index(stack, t * spf - self.tail_samples)

    def output_samples(self, frames: int) -> int:
        """Samples `decode` returns for `frames` frames."""
        return max(0, frames * self.samples_per_frame - self.tail_samples)

    def decode(self, codes: torch.Tensor, skip_frames: int = 0) -> torch.Tensor:
        """codes (B, NQ, T) int64 -> (B, (T - skip_frames)*samples_per_frame - tail_samples)
        float32 in [-1, 1]: the conv stack starts skip_frames in (exact for the samples
        stack_context_frames after that; the pre-transformer reads every frame)."""
        if codes.dim() != 3 or codes.shape[1] != self.num_quantizers:
            raise ValueError(f"codes must be (B, {self.num_quantizers}, T), got {tuple(codes.shape)}")
        m = self.module
        with torch.inference_mode():
            codes = codes.to(self.device, torch.long)
            if not skip_frames:
                return m(codes)[:, 0].float()
            # the module's forward, its conv stack over the frames from skip_frames on
            hidden = m.code_embedding(codes + m.code_offset).mean(1)
            hidden = m.pre_transformer(inputs_embeds=hidden).last_hidden_state
            wav = run_conv_stack(m, hidden.permute(0, 2, 1)[..., skip_frames:])
        return wav[:, 0].float()

    def decode_chunk(self, codes: torch.Tensor, left_context: int) -> torch.Tensor:
        """Decode (B, NQ, left_context + n) and keep the samples after the context, plus
        the tail the previous chunk could not produce (see `context_start`)."""
        if not 0 <= left_context <= codes.shape[-1]:
            raise ValueError(f"left_context {left_context} outside [0, {codes.shape[-1]}]")
        return self.decode(codes)[:, self.context_start(left_context):]

    def context_start(self, left_context: int) -> int:
        """First sample a chunk decoded after left_context frames contributes. A decode
        ends tail_samples short (its last frame's samples need the next frame), so a later
        chunk also emits those samples of its last context frame, now that the frame
        after it is known: chunks then join without a gap, and a stream yields exactly the
        one-shot length. (transformers' chunked_decode drops them at every boundary.)"""
        start = left_context * self.samples_per_frame
        return start - self.tail_samples if left_context > 0 else start


def _is_random(path: Path) -> bool:
    try:
        return bool(json.loads((path / FIXTURE_MARKER).read_text()).get("random_weights"))
    except (OSError, ValueError, AttributeError):
        return False


def load_code2wav(model_dir: str, *, dtype: str = "auto", device: str = "cpu") -> Code2Wav:
    """Load ONLY the code2wav of a combined Qwen3-Omni checkpoint directory.

    Reads config.json (``code2wav_config``) and the ``code2wav.*`` tensors of the
    (sharded) safetensors, strips the prefix and loads them with ``strict=True``: a
    missing or unexpected key is an EngineLoadError, never silently random weights.
    dtype "auto" = float32 on CPU, the checkpoint's dtype elsewhere.
    """
    from transformers import AutoConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    path = Path(model_dir).expanduser().resolve()
    if not (path / "config.json").is_file():
        raise EngineLoadError(f"model directory {path} has no config.json")
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as e:
        raise EngineLoadError(f"model directory {path}: cannot read config.json: {e}") from e
    c2w_config = getattr(config, "code2wav_config", None)
    if c2w_config is None:
        raise EngineLoadError(f"model directory {path}: config.json has no code2wav_config "
                              f"(model_type {getattr(config, 'model_type', None)!r})")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise EngineLoadError(f"bad device {device!r}: {e}") from e
    tensors = prefixed_tensors(path, CODE2WAV_PREFIX)
    if dtype == "auto":
        torch_dtype = (torch.float32 if dev.type == "cpu"
                       else next(iter(tensors.values())).dtype)
    elif dtype in _DTYPES:
        torch_dtype = _DTYPES[dtype]
    else:
        raise EngineLoadError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16, float16")
    with torch.random.fork_rng(devices=[]):  # construction draws init values: keep the
        module = Qwen3OmniMoeCode2Wav(c2w_config)  # caller's RNG stream untouched
    try:
        module.load_state_dict(tensors, strict=True)  # every weight overwritten, or an error
    except RuntimeError as e:
        raise EngineLoadError(f"model directory {path}: code2wav weights do not match the "
                              f"config: {e}") from e
    module.to(dev)
    for param in module.parameters():  # buffers (RoPE inv_freq) stay float32, as transformers
        param.data = param.data.to(torch_dtype)
    module.eval()
    module.requires_grad_(False)
    return Code2Wav(module=module, config=c2w_config, device=dev, dtype=torch_dtype,
                    model_dir=str(path), random_weights=_is_random(path))


class Code2WavRunner:
    """Qwen3-Omni's code2wav stage: {"codes": (NQ, t) ints}; a chunk of n new frames is
    decoded with up to `left_context` earlier ones, its output the samples after them plus
    the previous chunk's missing tail (`Code2Wav.context_start`): chunks join without gaps.
    Options: chunk_frames (25), left_context (25, >= 1 for that), first_chunk_frames,
    chunk_growth (2: chunks grow 4, 8, 16, 25, ...), complete_chunk_frames (300: codes that
    arrive complete), fixed_shapes (calls padded to a few shapes: prepare_calls)."""

    input_key = "codes"
    FIXED_SHAPES_ON_GPU = False  # unmeasured on this decoder (Qwen3-TTS's: qwen3_tts_codec)
    FUSED_SNAKE_ON_GPU = False  # the same
    OPTIONS = frozenset({"chunk_frames", "first_chunk_frames", "chunk_growth",
                         "complete_chunk_frames", "left_context", "fixed_shapes",
                         "trim_stack", "fused_snake"})

    def __init__(self, code2wav: Code2Wav, options: Mapping[str, Any] | None = None) -> None:
        opts = dict(options or {})
        self.c2w = code2wav
        self.chunk_frames = _pos_int(opts, "chunk_frames", 25)
        self.first_chunk_frames = _pos_int(opts, "first_chunk_frames", self.chunk_frames)
        self.chunk_growth = _pos_int(opts, "chunk_growth", 2)
        self.complete_chunk_frames = _pos_int(opts, "complete_chunk_frames", 300)
        self.left_context = _pos_int(opts, "left_context", 25, allow_zero=True)
        self.sample_rate = code2wav.sample_rate
        # frames per decode call (GenerationEngine max_batch_frames). On CPU a big batch
        # is slower per frame (tiny model, 2-core VM, 48-frame rows: 1582 frames/s at 1 row,
        # 413 at 32); 64 frames is one full chunk with its context, so a request's next input
        # waits less behind a running call (against 128: bench/results/archive/omni-cpu-
        # code2wav-batch-frames.md). On a GPU 4096: unlimited, 32 complete answers made one
        # 2.88 GiB call that ran the shared H200 out of memory (bench/results/archive/
        # server-full-h200-c32-code2wav-oom.log); 4096 still takes c=32's streamed chunks in
        # one call. With a memory budget on a GPU the engine sizes it (generation/memory.py).
        self.batch_frames = 4096 if code2wav.device.type == "cuda" else 64
        self.device = code2wav.device
        # fixed_shapes: calls padded to a few shapes (prepare_calls); default per model
        self.fixed_shapes = flag_option(opts, "fixed_shapes", self.FIXED_SHAPES_ON_GPU
                                        and self.device.type == "cuda")
        self.shapes: CallShapes | None = None
        # trim_stack: the conv stack over the frames kept + its reach only (stack_skip)
        self.trim_stack = flag_option(opts, "trim_stack", True)
        # fused_snake: the decoder's SnakeBeta activations as one kernel each (CUDA only)
        if flag_option(opts, "fused_snake", self.FUSED_SNAKE_ON_GPU) and self.device.type == "cuda":
            from omni.models.snake import fuse_snakes

            log.info("code2wav: %d SnakeBeta activations fused", fuse_snakes(code2wav.module))

    def prepare_calls(self, max_rows: int, max_frames: int) -> bool:
        """The engine's limits per call: with fixed_shapes, calls padded to a few shapes,
        each decoded once here (omni/models/code2wav_shapes.py); True if it made calls."""
        if self.fixed_shapes:
            self.shapes = prepare_shapes(self, max_rows, max_frames)
        return self.fixed_shapes

    def probe_batch(self, rows: int, frames: int) -> torch.Tensor:
        """A (rows, NQ, frames) batch of valid codes, to measure a call's memory."""
        return torch.zeros(rows, self.c2w.num_quantizers, frames, dtype=torch.long)

    def parse(self, value: Any) -> torch.Tensor:
        """Nested list or integer tensor (NQ, t) -> int64 tensor; ValueError naming the problem."""
        nq, cb = self.c2w.num_quantizers, self.c2w.codebook_size
        if isinstance(value, torch.Tensor):  # codes that came through the connector
            if value.dim() != 2 or value.shape[0] != nq or value.is_floating_point():
                raise ValueError(f"codes tensor must be integer ({nq}, frames), got "
                                 f"{value.dtype} {tuple(value.shape)}")
            value = value.tolist()
        if not isinstance(value, Sequence) or isinstance(value, str | bytes) or len(value) != nq:
            raise ValueError(f"codes must be a list of {nq} lists (one per quantizer), got "
                             f"{type(value).__name__} of length "
                             f"{len(value) if hasattr(value, '__len__') else '?'}")
        rows = []
        for q, row in enumerate(value):
            if not isinstance(row, Sequence) or isinstance(row, str | bytes):
                raise ValueError(f"codes[{q}] must be a list of ints")
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in row):
                raise ValueError(f"codes[{q}] holds non-integers")
            rows.append(row)
        if len({len(r) for r in rows}) != 1:
            raise ValueError(f"codes rows differ in length: {[len(r) for r in rows]}")
        t = torch.tensor(rows, dtype=torch.long).reshape(nq, len(rows[0]))
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= cb):
            raise ValueError(f"codes out of range [0, {cb}): min {int(t.min())}, max {int(t.max())}")
        return t

    def join(self, values: list[Any]) -> list[list[int]] | None:
        """Chunks of nested lists (one list per quantizer) as one, frames in order; None
        when any chunk is something else (each is then parsed alone, for a precise error)."""
        nq = self.c2w.num_quantizers
        if not values or not all(isinstance(v, list) and len(v) == nq
                                 and all(isinstance(row, list) for row in v) for v in values):
            return None
        return [[c for v in values for c in v[q]] for q in range(nq)]

    def run(self, batch: torch.Tensor, contexts: list[int]) -> list[torch.Tensor]:
        """batch (B, NQ, T) -> per row the float32 samples after its left context."""
        return self.decode_rows(batch, contexts, self.shapes)

    def decode_rows(self, batch: torch.Tensor, contexts: list[int],
                    shapes: CallShapes | None) -> list[torch.Tensor]:
        """run's decode, padded to shapes' when given; the decoder's conv stack skips the
        leading frames no kept sample reads (stack_skip)."""
        skip = self.stack_skip(contexts)
        if skip and shapes is not None:  # keep to the stack lengths decoded at load
            cap = shapes.stack_skip_cap(len(batch), batch.shape[-1],
                                        self.c2w.stack_context_frames)
            skip = skip if cap is None else min(skip, cap)
        decode = self.c2w.decode if not skip else partial(self.c2w.decode, skip_frames=skip)
        cut = skip * self.c2w.samples_per_frame  # the samples the skipped frames would give
        if shapes is None:
            wav = decode(batch).cpu()
        else:
            wav = decode_padded(decode, batch, shapes,
                                lambda frames: self.c2w.output_samples(frames) - cut).cpu()
        return [wav[i, self.c2w.context_start(c) - cut:] for i, c in enumerate(contexts)]

    def stack_skip(self, contexts: list[int]) -> int:
        """Leading frames of a call its decoder's conv stack leaves out: each row keeps
        the stack's reach (stack_context_frames, 10 in both releases) of its left context
        there. The pre-transformer still reads the whole context (25 frames), but the conv
        stack, at up to 24 k samples a second and the decode's cost, runs over chunk + 10
        frames instead of chunk + 25, with the same samples out."""
        if not self.trim_stack or not contexts:
            return 0
        return max(0, min(contexts) - self.c2w.stack_context_frames)

    def pack(self, wav: torch.Tensor) -> dict[str, Any]:
        """One chunk's output fields: the float32 samples (a tensor: the engine process
        publishes it through the connector) + format."""
        pcm = wav.detach().to(torch.float32).contiguous()
        return {"audio": pcm, "sample_rate": self.sample_rate, "samples": int(wav.numel())}

    def info(self) -> dict[str, Any]:
        c = self.c2w
        return {"model": "qwen3_omni_code2wav", "model_dir": c.model_dir,
                "random_weights": c.random_weights, "dtype": str(c.dtype).removeprefix("torch."),
                "device": str(c.device), "sample_rate": c.sample_rate,
                "samples_per_frame": c.samples_per_frame, "tail_samples": c.tail_samples,
                "num_quantizers": c.num_quantizers, "codebook_size": c.codebook_size,
                "receptive_field_frames": c.receptive_field_frames,
                "chunk_frames": self.chunk_frames, "first_chunk_frames": self.first_chunk_frames,
                "chunk_growth": self.chunk_growth,
                "left_context": self.left_context, "audio_format": "f32le"}


def _pos_int(opts: Mapping[str, Any], name: str, default: int, allow_zero: bool = False) -> int:
    v = opts.get(name, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < (0 if allow_zero else 1):
        raise EngineLoadError(f"option {name} must be an integer >= {0 if allow_zero else 1}, got {v!r}")
    return v


def build_code2wav_runner(*, model_dir: str, device: str, dtype: str,
                          options: Mapping[str, Any] | None) -> Code2WavRunner:
    return Code2WavRunner(load_code2wav(model_dir, dtype=dtype, device=device), options)
