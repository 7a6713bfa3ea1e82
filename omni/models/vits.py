"""VITS / MMS-TTS voices (transformers ``VitsModel``, torch): the model adapter.

A voice is a Hugging Face ``VitsModel`` checkpoint directory (``facebook/mms-tts-*``
layout: config.json, model.safetensors, vocab.json, tokenizer_config.json), loaded from
local files only. One speaker per directory, served as one voice whose id is the
directory's name (option ``voice_id``).

Unit of work: one sentence (speech.split_sentences, at most ``max_chars`` characters),
tokenized once when the request arrives. `VitsRunner` serves the voice as a
``generation`` stage in the engine's items mode (omni/models/speech.py): requests with
the same speed share ONE padded forward call per engine step, and each row is trimmed to
its own length (VitsModelOutput.sequence_lengths).

Stage options: batch (share forward calls across requests; default: on CUDA only, as
measured), max_chars (400), voice_id (the directory name), language (the
tokenizer's, else "en"), openai_voices (false), noise_scale / noise_scale_duration (the
config's). Per-request params: speed, voice, seed (optional int: that request's
sentences are then rendered in calls of their own, so its audio does not depend on
which other requests shared the step).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omni.engines.base import EngineLoadError, flag_option, number_option
from omni.fixtures.release_files import FIXTURE_MARKER
from omni.models.speech import (
    check_speed,
    pick_voice,
    speech_output,
    split_sentences,
    texts,
    voice_entry,
)

DEFAULT_MAX_CHARS = 400
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# weights used only in training (posterior encoder): a checkpoint may leave them out
_TRAINING_ONLY = ("posterior_encoder.",)


class _RowMasks:
    """Makes a padded batch decode each row exactly as it decodes alone.

    VitsModel masks everything up to the spectrogram, but its HiFi-GAN decoder has conv
    biases: the zero frames past a shorter row's end become non-zero inside the decoder
    and leak into that row's last ~2 frames. Zeroing every decoder conv's input past the
    row's length at that conv's resolution gives each row the zero padding it sees when
    decoded alone. The row lengths come from the padding mask the model passes its flow.
    In place (masked_fill_, one mask per resolution): only garbage past a row's end is
    overwritten. On the tiny fixture's 1-16 channel convs the masks add ~25-45% to a
    batched CPU call (a multiply-copy per conv added ~60%); next to a release's
    512-channel convs they are small.
    """

    def __init__(self, model: nn.Module) -> None:
        self.frames: torch.Tensor | None = None  # (B,) valid frames per row, this call
        self.total = 0  # padded frames, this call
        self._pads: dict[int, torch.Tensor] = {}  # length -> (B, 1, length) True = padding
        model.flow.register_forward_pre_hook(self._take_lengths)
        for name, module in model.decoder.named_modules():
            if isinstance(module, nn.Conv1d | nn.ConvTranspose1d) and not name.startswith("cond"):
                module.register_forward_pre_hook(self._mask)

    def _take_lengths(self, module: nn.Module, args: tuple) -> None:
        mask = args[1] if len(args) > 1 else None  # flow(latents, output_padding_mask, ...)
        self.frames, self._pads = None, {}
        if isinstance(mask, torch.Tensor) and mask.dim() == 3 and mask.shape[1] == 1:
            frames = (mask > 0).sum(dim=(1, 2))  # exact counts, whatever the dtype
            if bool((frames < mask.shape[-1]).any()):  # some row is padded
                self.frames, self.total = frames, mask.shape[-1]

    def _mask(self, module: nn.Module, args: tuple) -> None:
        x = args[0]
        if self.frames is None or x.shape[0] != self.frames.shape[0]:
            return
        length = x.shape[-1]
        pad = self._pads.get(length)
        if pad is None:
            valid = torch.ceil(self.frames * (length / self.total))  # length at this rate
            pad = torch.arange(length, device=x.device)[None, :] >= valid[:, None]
            pad = self._pads[length] = pad[:, None, :]
        x.masked_fill_(pad, 0.0)


class VitsTTS:
    """One loaded VITS voice: sentence splitting + batched synthesis (see module doc)."""

    def __init__(self, model: nn.Module, tokenizer: Any, model_dir: Path, device: torch.device,
                 options: Mapping[str, Any] | None = None) -> None:
        opts = dict(options or {})
        cfg = model.config
        self.model, self.tokenizer, self.model_dir, self.device = model, tokenizer, model_dir, device
        self.max_chars = number_option(opts, "max_chars", DEFAULT_MAX_CHARS, int, 16)
        # noise is a model attribute in VitsModel.forward, not an argument: set once here
        model.noise_scale = number_option(opts, "noise_scale", float(cfg.noise_scale), float, 0.0)
        model.noise_scale_duration = number_option(opts, "noise_scale_duration",
                                             float(cfg.noise_scale_duration), float, 0.0)
        self.sample_rate = int(cfg.sampling_rate)
        self.hop = math.prod(cfg.upsample_rates)  # samples per spectrogram frame
        voice_id = opts.get("voice_id") or model_dir.name
        language = getattr(tokenizer, "language", None) or opts.get("language") or "en"
        self.voices = [voice_entry(str(voice_id), str(voice_id), str(language), self.sample_rate)]
        self.openai_voices = flag_option(opts, "openai_voices", False)
        self.pad_id = int(tokenizer.pad_token_id or 0)
        self._masks = _RowMasks(model)

    def sentences(self, text: Any) -> list[list[int]]:
        """Text (or a list of texts) -> token ids per sentence, in order. Sentences with
        nothing the vocabulary knows are dropped; ValueError when none is left."""
        out = []
        for part in texts(text):
            for sentence in split_sentences(part, self.max_chars):
                ids = self.tokenizer(sentence)["input_ids"]
                if ids:
                    out.append(list(ids))
        if not out:
            raise ValueError("text has nothing to synthesize (no character the voice knows)")
        return out

    def synthesize(self, units: list[list[int]], speed: float = 1.0,
                   seed: int | None = None) -> list[tuple[torch.Tensor, int]]:
        """Sentences (token ids) -> [(float32 mono audio in [-1, 1], ids read)], rendered
        in ONE forward call: right-padded, attention-masked, each row trimmed."""
        width = max(len(u) for u in units)
        ids = torch.full((len(units), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(units), width), dtype=torch.long)
        for i, u in enumerate(units):
            ids[i, :len(u)] = torch.tensor(u)
            mask[i, :len(u)] = 1
        rate = float(self.model.config.speaking_rate) * check_speed(speed)
        with torch.inference_mode(), _rng(seed, self.device):
            out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                             speaking_rate=rate)
        wav = out.waveform.float().clamp(-1.0, 1.0).cpu()
        lengths = out.sequence_lengths.tolist()
        # clone: each output owns its samples, not a view keeping the whole batch alive
        return [(wav[i, :n].clone(), len(u)) for i, (n, u) in enumerate(zip(lengths, units, strict=True))]

    def info(self) -> dict[str, Any]:
        cfg = self.model.config
        return {"model": "vits", "model_dir": str(self.model_dir),
                "random_weights": _is_random(self.model_dir), "device": str(self.device),
                "dtype": str(self.model.dtype).removeprefix("torch."),
                "sample_rate": self.sample_rate, "hop_length": self.hop, "voices": self.voices,
                "openai_voice_alias": self.voices[0]["id"] if self.openai_voices else None,
                "max_chars": self.max_chars, "noise_scale": self.model.noise_scale,
                "noise_scale_duration": self.model.noise_scale_duration,
                "speaking_rate": float(cfg.speaking_rate), "audio_format": "f32le"}


@contextmanager
def _rng(seed: int | None, device: torch.device) -> Iterator[None]:
    """For a seeded call, a forked RNG seeded with it (the caller's stream is untouched)."""
    if seed is None:
        yield
        return
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, device_type=device.type):
        torch.manual_seed(seed)
        yield


def _is_random(path: Path) -> bool:
    try:
        return bool(json.loads((path / FIXTURE_MARKER).read_text()).get("random_weights"))
    except (OSError, ValueError, AttributeError):
        return False


def _dtype(dtype: str) -> torch.dtype:
    # "auto" = float32 everywhere: MMS releases are float32, and HiFi-GAN in half
    # precision is audibly worse for a model this small to run
    if dtype in ("auto", None):
        return torch.float32
    if dtype not in _DTYPES:
        raise EngineLoadError(f"vits: unknown dtype {dtype!r}; use auto, {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def _load_model(path: Path, dtype: torch.dtype, device: torch.device) -> nn.Module:
    from transformers import VitsModel

    try:
        model, info = VitsModel.from_pretrained(str(path), local_files_only=True, dtype=dtype,
                                                output_loading_info=True)
    except Exception as e:
        raise EngineLoadError(f"vits: cannot load the model in {path}: {e}") from e
    missing = [k for k in info.get("missing_keys", []) if not k.startswith(_TRAINING_ONLY)]
    if missing:  # transformers would fill them with random values: refuse instead
        raise EngineLoadError(f"vits: {path} lacks weights {sorted(missing)[:5]} "
                              f"({len(missing)} in all)")
    try:
        model.to(device)
    except (RuntimeError, AssertionError) as e:
        raise EngineLoadError(f"vits: cannot move the model to {device}: {e}") from e
    return model.eval().requires_grad_(False)


def _load_tokenizer(path: Path) -> Any:
    from transformers import VitsTokenizer
    from transformers.utils import is_phonemizer_available

    try:
        tok = VitsTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as e:
        raise EngineLoadError(f"vits: cannot load the tokenizer in {path}: {e}") from e
    if tok.phonemize and not is_phonemizer_available():  # refuse now, not per request
        raise EngineLoadError(f"vits: the tokenizer in {path} phonemizes and needs the "
                              "'phonemizer' package (with espeak-ng)")
    return tok


def load_vits(model_dir: str | Path | None, *, device: str = "cpu", dtype: str = "auto",
              options: Mapping[str, Any] | None = None) -> VitsTTS:
    """The VitsModel voice in model_dir (local files only), in eval mode."""
    if not model_dir:
        raise EngineLoadError("model 'vits' needs a model_dir")
    path = Path(model_dir).expanduser().resolve()
    if not path.is_dir():
        raise EngineLoadError(f"vits: {path} is not a directory")
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise EngineLoadError(f"vits: {path} has no readable config.json: {e}") from e
    if config.get("model_type") != "vits":
        raise EngineLoadError(f"vits: {path} holds model_type {config.get('model_type')!r}, "
                              "not 'vits'")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise EngineLoadError(f"vits: bad device {device!r}: {e}") from e
    model = _load_model(path, _dtype(dtype), dev)
    return VitsTTS(model, _load_tokenizer(path), path, dev, options)


class VitsRunner:
    """Generation-engine runner (items mode): input ``text``, one output per sentence."""

    items = True
    input_key = "text"
    OPTIONS = frozenset({"batch", "max_chars", "noise_scale", "noise_scale_duration",
                         "voice_id", "language", "openai_voices"})  # here and VitsTTS's

    def __init__(self, tts: VitsTTS, batch: bool | None = None) -> None:
        self.tts = tts
        # Padded batches pay on a GPU (32 sentences: 0.015 s batched vs 0.36 s one by one,
        # H200) and lose on one CPU thread (0.75 s vs 0.36 s), so by default only CUDA
        # batches; on CPU the engine then runs one sentence per step (stage option batch).
        self.batches_units = tts.device.type == "cuda" if batch is None else bool(batch)

    def split(self, value: Any, params: Mapping[str, Any]) -> list[list[int]]:
        check_speed(params.get("speed", 1.0))
        pick_voice(params, self.tts.voices)  # ValueError for an unknown voice
        seed = params.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        return self.tts.sentences(value)

    def group_key(self, params: Mapping[str, Any]) -> float:
        return float(params.get("speed", 1.0))  # the model takes one speaking rate per call

    def run_items(self, units: list[list[int]],
                  params: list[Mapping[str, Any]]) -> list[tuple[torch.Tensor, int]]:
        """All unseeded units in one padded forward call; seeded ones each alone."""
        speed = float(params[0].get("speed", 1.0))  # one group = one speed
        results: list[Any] = [None] * len(units)
        shared = [i for i, p in enumerate(params) if p.get("seed") is None]
        if shared:
            for i, r in zip(shared, self.tts.synthesize([units[i] for i in shared], speed),
                            strict=True):
                results[i] = r
        for i, p in enumerate(params):
            if p.get("seed") is not None:
                results[i] = self.tts.synthesize([units[i]], speed, seed=int(p["seed"]))[0]
        return results

    def pack(self, result: tuple[torch.Tensor, int]) -> dict[str, Any]:
        audio, n_ids = result
        return speech_output(audio, self.tts.sample_rate, n_ids, int(audio.numel()) // self.tts.hop)

    def info(self) -> dict[str, Any]:
        return self.tts.info()


def build_vits_runner(*, model_dir: str | None, device: str, dtype: str,
                      options: Mapping[str, Any] | None) -> VitsRunner:
    batch = (options or {}).get("batch")
    if batch is not None and not isinstance(batch, bool):
        raise EngineLoadError(f"vits: option batch must be true or false, got {batch!r}")
    return VitsRunner(load_vits(model_dir, device=device, dtype=dtype, options=options), batch)
