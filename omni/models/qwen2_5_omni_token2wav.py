"""Qwen2.5-Omni's token2wav as a generation-engine runner: codec codes -> 24 kHz audio.

What the model is (transformers' ``Qwen2_5OmniToken2WavModel``): a DiT that turns the
talker's codes (50 per second, each repeated ``repeats`` = 2 times: 100 mel frames/s)
into a mel spectrogram by flow matching, conditioned on the speaker (``cond``, an
embedding, and ``ref_mel``, a reference mel, both from the release's spk_dict.pt), then
a BigVGAN vocoder (240 samples per mel frame: 24 kHz). The DiT starts from Gaussian
noise ``torch.randn(1, codes * repeats, mel_dim)`` drawn from torch's global RNG and
integrates 10 RK4 steps with classifier-free guidance (generate's defaults: num_steps 10,
guidance_scale 0.5, sway_coefficient -1).

Quirks:
- It runs in float32 (generate casts it: the model says it must); the dtype option is
  ignored for it.
- The noise: each utterance is decoded with torch's RNG seeded by the stage option
  ``seed`` (0) inside ``fork_rng``, so an utterance's audio is a function of its codes,
  speaker and the seed (and equals ``torch.manual_seed(seed); token2wav(...)``), never of
  what ran before it, and the engine's other RNG users are not disturbed.
- Streaming: no chunked form of it equals the whole-utterance decode. transformers'
  Token2Wav has only the whole form (Qwen's overlapping-window streaming is not in it), and
  a window cannot reproduce the whole: each of the 10 RK4 steps evaluates the DiT 4
  times, and every evaluation reaches a block or two (``block_size`` mel frames, the
  ``look_ahead_layers`` / ``look_backward_layers``) further each way, so a mel frame of the
  result depends on codes ~40 evaluations x 2 blocks away (the real release: ~19 s of
  codes ahead); the starting noise is drawn in one ``randn`` for the whole length; the
  blocks are counted from the window's start. So the runner streams at utterance
  boundaries of its own choosing: with ``chunk_frames`` > 0 the code stream is cut into
  chunks (``first_chunk_frames``, then ``chunk_growth`` times longer up to
  ``chunk_frames``) as the talker writes them, and each chunk is decoded as an utterance
  of its own by transformers' Token2Wav, after up to ``left_context`` earlier codes whose
  samples are dropped (480 samples a code, exactly: BigVGAN has no tail), so the voice
  and prosody carry over the cut. A streamed chunk equals ``torch.manual_seed(seed);
  token2wav(context + chunk)`` after the context's samples; the whole answer equals the
  whole-utterance decode only when it fits in the first chunk. ``chunk_frames`` 0 (the
  runner's default): whole utterances, once their codes are complete.
- The rows of one call (the engine groups rows of equal length) are decoded together,
  one DiT batch per speaker: each row starts from the noise its decode alone would draw
  (one ``randn`` of its length after the seed: the same for every row), so a row's audio
  is what it would be alone, within float noise, whatever its neighbours. generate has
  no batched form (its ``sample`` draws a different noise row per batch row), so the
  batched ODE is written out in ``decode_rows``, with transformers' DiT, RK4 solver and
  BigVGAN. Before, each row was decoded alone: at c=8 on an H100 the streamed chunks of
  eight requests ran one after another, 6.3 s an engine step
  (bench/results/omni-qwen2_5_omni-h100.md). Memory: a call's rows x codes stay within
  ``batch_frames`` (the DiT's longest utterance), so a batch's activations, and its
  attention (rows x length^2 <= longest^2), never pass those of the one longest
  utterance the runner decoded before.
- Input frames are {"codes": [[code, ...], [speaker, ...]]}: the talker stage puts its
  speaker's index in the release's table under every code (qwen2_5_omni_talker.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omni.engines.base import EngineLoadError, number_option
from omni.models.causal_lm import _is_random
from omni.models.checkpoint_parts import prefixed_tensors
from omni.models.qwen2_5_omni_talker import load_speakers

TOKEN2WAV_PREFIX = "token2wav."
SAMPLE_RATE = 24000  # not in the config: BigVGAN's 240 samples per mel frame at 100 Hz


@dataclass
class Token2Wav:
    """A loaded token2wav (float32, eval) and the speakers' conditioning."""

    module: Any  # Qwen2_5OmniToken2WavModel
    conds: list[torch.Tensor]  # per speaker (1, enc_emb_dim)
    ref_mels: list[torch.Tensor]  # per speaker (1, frames, mel_dim)
    names: list[str]
    device: torch.device
    model_dir: str = ""
    random_weights: bool = False

    @property
    def num_embeds(self) -> int:
        return int(self.module.config.dit_config.num_embeds)

    @property
    def max_codes(self) -> int:
        dit = self.module.config.dit_config
        return int(dit.max_position_embeddings) // int(dit.repeats)

    @property
    def samples_per_code(self) -> int:
        dit, vocoder = self.module.config.dit_config, self.module.config.bigvgan_config
        prod = 1
        for r in vocoder.upsample_rates:
            prod *= int(r)
        return int(dit.repeats) * prod

    @torch.inference_mode()
    def decode_rows(self, codes: torch.Tensor, speaker: int, seed: int, num_steps: int = 10,
                    guidance_scale: float = 0.5, sway_coefficient: float | None = -1.0
                    ) -> torch.Tensor:
        """codes (B, T) int64 of one speaker -> (B, samples): each row = transformers'
        Token2Wav on it alone after the seed, in one batch. The lines of transformers' DiT
        ``sample`` (5.24), but for the noise: one draw of a single row's shape, shared by
        every row (module doc)."""
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
            RungeKutta4ODESolver,
        )

        dit, vocoder = self.module.code2wav_dit_model, self.module.code2wav_bigvgan_model
        rows, frames = codes.shape[0], codes.shape[1] * dit.repeats
        if frames > dit.config.max_position_embeddings:
            raise ValueError(f"{codes.shape[1]} codes exceed the DiT's {self.max_codes}")
        codes = codes.to(self.device)
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            noise = torch.randn([1, frames, dit.mel_dim], dtype=torch.float32, device=self.device)
        reference = self.ref_mels[speaker].expand(rows, -1, -1)
        speaker_rows = self.conds[speaker].expand(rows, -1).unsqueeze(1).repeat(1, frames, 1)

        def velocity(time_step: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
            cfg = guidance_scale >= 1e-5
            out = dit(hidden_states=state, speaker_embedding=speaker_rows,
                      condition_vector=reference, quantized_code=codes, time_step=time_step,
                      drop_audio_conditioning=False, drop_code=False, apply_cfg=cfg)
            if not cfg:
                return out
            guided, null = torch.chunk(out, 2, dim=0)
            return guided + (guided - null) * guidance_scale

        times = torch.linspace(0, 1, num_steps, device=self.device, dtype=torch.float32)
        if sway_coefficient is not None:
            times += sway_coefficient * (torch.cos(torch.pi / 2 * times) - 1 + times)
        start = noise.expand(rows, -1, -1).contiguous()
        mel = RungeKutta4ODESolver(function=velocity, initial_value=start).integrate(times)[-1]
        return vocoder(mel.permute(0, 2, 1)).reshape(rows, -1).float()


def load_token2wav(model_dir: str, *, device: str = "cpu") -> Token2Wav:
    """The token2wav of a Qwen2.5-Omni release: the ``token2wav.*`` tensors loaded with
    strict=True (never silently random), plus the speakers of spk_dict.pt."""
    from transformers import AutoConfig
    from transformers.initialization import no_init_weights
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavModel

    path = Path(model_dir).expanduser().resolve()
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True).token2wav_config
    except Exception as e:
        raise EngineLoadError(f"model directory {path}: no Qwen2.5-Omni token2wav config: "
                              f"{e}") from e
    dev = torch.device(device)
    speakers = load_speakers(path)
    with no_init_weights(), torch.random.fork_rng(devices=[]):
        module = Qwen2_5OmniToken2WavModel(config)
    try:
        module.load_state_dict(prefixed_tensors(path, TOKEN2WAV_PREFIX), strict=True)
    except RuntimeError as e:
        raise EngineLoadError(f"model directory {path}: token2wav weights do not match the "
                              f"config: {e}") from e
    module.to(dev).float().eval().requires_grad_(False)
    conds = [s["cond"].to(dev).float().reshape(1, -1) for s in speakers.values()]
    mels = [s["ref_mel"].to(dev).float().reshape(1, -1, int(config.dit_config.mel_dim))
            for s in speakers.values()]
    return Token2Wav(module, conds, mels, list(speakers), dev, str(path), _is_random(path))


class Token2WavRunner:
    """The generation-engine runner of the token2wav stage (see the module doc).
    Options: num_steps (10), guidance_scale (0.5), sway_coefficient (-1.0), seed (0);
    streaming: chunk_frames (0: whole utterances), first_chunk_frames (= chunk_frames),
    chunk_growth (2), left_context (0), in codes (50 a second)."""

    input_key = "codes"
    OPTIONS = frozenset({"num_steps", "guidance_scale", "sway_coefficient", "seed",
                         "chunk_frames", "first_chunk_frames", "chunk_growth", "left_context"})

    def __init__(self, t2w: Token2Wav, options: Mapping[str, Any] | None = None) -> None:
        opts = dict(options or {})
        self.t2w = t2w
        self.sampling = {"num_steps": number_option(opts, "num_steps", 10, int, 1),
                         "guidance_scale": number_option(opts, "guidance_scale", 0.5, float, 0.0),
                         "sway_coefficient": number_option(opts, "sway_coefficient", -1.0, float)}
        self.seed = number_option(opts, "seed", 0, int, 0)
        self._chunking(opts)
        # a complete input: whole utterances (the longest ones in DiT-sized windows)
        self.complete_chunk_frames = t2w.max_codes - self.left_context
        self.batch_frames = t2w.max_codes
        self.sample_rate = SAMPLE_RATE
        self.device = t2w.device

    def _chunking(self, opts: Mapping[str, Any]) -> None:
        """Streamed chunks (module doc); without chunk_frames a whole utterance is one
        chunk: streamed input waits until it is complete."""
        most = self.t2w.max_codes
        chunk = number_option(opts, "chunk_frames", 0, int, 0)
        self.left_context = number_option(opts, "left_context", 0, int, 0) if chunk else 0
        self.chunk_frames = chunk or most
        self.first_chunk_frames = (number_option(opts, "first_chunk_frames", chunk, int, 1)
                                   if chunk else most)
        self.chunk_growth = number_option(opts, "chunk_growth", 2, int, 1) if chunk else 1
        if max(self.chunk_frames, self.first_chunk_frames) + self.left_context > most:
            raise EngineLoadError(f"options chunk_frames, first_chunk_frames + left_context "
                                  f"must fit the DiT's {most} codes, got {self.chunk_frames}, "
                                  f"{self.first_chunk_frames} + {self.left_context}")

    def parse(self, value: Any) -> torch.Tensor:
        """[[codes...], [speaker...]] (or such an integer tensor) -> (2, t) int64."""
        if isinstance(value, torch.Tensor):
            value = value.tolist()
        if not isinstance(value, Sequence) or isinstance(value, str | bytes) or len(value) != 2 \
                or not all(isinstance(r, Sequence) and not isinstance(r, str | bytes)
                           for r in value):
            raise ValueError("codes must be [[code, ...], [speaker, ...]] (two lists)")
        if not all(isinstance(v, int) and not isinstance(v, bool) for r in value for v in r):
            raise ValueError("codes holds non-integers")
        if len(value[0]) != len(value[1]):
            raise ValueError(f"codes rows differ in length: {len(value[0])}, {len(value[1])}")
        t = torch.tensor(value, dtype=torch.long).reshape(2, len(value[0]))
        if t.shape[1] and (int(t[0].min()) < 0 or int(t[0].max()) > self.t2w.num_embeds):
            raise ValueError(f"codes out of range [0, {self.t2w.num_embeds}]")
        if t.shape[1] and (int(t[1].min()) < 0 or int(t[1].max()) >= len(self.t2w.names)):
            raise ValueError(f"speaker index out of range [0, {len(self.t2w.names)})")
        return t

    def join(self, values: list[Any]) -> list[list[int]] | None:
        if not values or not all(isinstance(v, list) and len(v) == 2
                                 and all(isinstance(r, list) for r in v) for v in values):
            return None
        return [[c for v in values for c in v[0]], [s for v in values for s in v[1]]]

    def run(self, batch: torch.Tensor, contexts: list[int]) -> list[torch.Tensor]:
        """(B, 2, T) -> per row its utterance's samples after its left context; the rows of
        one speaker decoded in one batch (module doc)."""
        by_speaker: dict[int, list[int]] = {}
        for i, row in enumerate(batch):
            if int(row[1].min()) != int(row[1].max()):
                raise ValueError("an utterance's frames name different speakers")
            by_speaker.setdefault(int(row[1, 0]), []).append(i)
        wavs: dict[int, torch.Tensor] = {}
        for speaker, index in by_speaker.items():
            decoded = self.t2w.decode_rows(batch[index, 0], speaker, self.seed, **self.sampling)
            wavs.update(zip(index, decoded.cpu(), strict=True))
        per_code = self.t2w.samples_per_code
        return [wavs[i][context * per_code:] for i, context in enumerate(contexts)]

    def pack(self, wav: torch.Tensor) -> dict[str, Any]:
        pcm = wav.detach().to(torch.float32).contiguous()
        return {"audio": pcm, "sample_rate": self.sample_rate, "samples": int(wav.numel())}

    def info(self) -> dict[str, Any]:
        t = self.t2w
        return {"model": "qwen2_5_omni_token2wav", "model_dir": t.model_dir,
                "random_weights": t.random_weights, "dtype": "float32",
                "device": str(t.device), "sample_rate": self.sample_rate,
                "samples_per_code": t.samples_per_code, "max_codes": t.max_codes,
                "speakers": t.names, "seed": self.seed, **self.sampling,
                "chunk_frames": self.chunk_frames, "first_chunk_frames": self.first_chunk_frames,
                "chunk_growth": self.chunk_growth, "left_context": self.left_context,
                "audio_format": "f32le"}


def build_token2wav_runner(*, model_dir: str, device: str, dtype: str,
                           options: Mapping[str, Any] | None) -> Token2WavRunner:
    return Token2WavRunner(load_token2wav(model_dir, device=device), options)
