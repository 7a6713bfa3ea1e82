"""Qwen3-TTS (12 Hz CustomVoice and Base releases) on qwen-tts's own model code: the model
adapter.

Runs only in an environment where the ``qwen-tts`` package imports (it pins transformers
4.57.3): the ``qwen3-tts`` stage environment, scripts/install_qwen3_tts_env.sh; the
preset (omni/config/presets/qwen3_tts.yaml) names it with ``env: qwen3-tts``.

Fused layout: one ``generation`` stage holds the whole model, the talker (text -> first
codebook, autoregressive), its code predictor (the other codebooks of each frame) and the
Code2Wav decoder of ``speech_tokenizer/`` (codes -> 24 kHz audio, 1920 samples a frame).
The engine's items mode drives it: a request's text becomes sentences (units), each one
output; ready sentences of every request, whatever their voice, are one call of qwen-tts's
own batched ``generate`` (left-padded talker prompts, one decode of all rows), so a
sentence's audio equals ``Qwen3TTSModel.generate_custom_voice`` for that sentence. That is
with ``chunk_frames: 0``; streamed (the default), sentences join and leave one running
batch of the talker step by step (continuous batching: qwen3_tts_batch.py), and a
sentence's audio still equals qwen-tts's for it alone (sampled: with the request's
``seed``). qwen-tts's ``generate`` draws every row's samples from the global RNG and
takes no generator, so with ``chunk_frames: 0`` the sampled sentences of seeded requests
run in that step loop instead, each drawing from its own generator, and leave whole
(decoded in qwen-tts's chunks of 300 frames): the same audio alone and in any batch.

Voices are the release's speakers (config.json ``talker_config.spk_id``); OpenAI's voice
names map to the first one when the stage's ``openai_voices`` is true. A Base release has
none: it clones the voice of each request's reference clip (``ref_audio`` input, decoded
by the front end, and ``ref_text`` param; omni/models/qwen3_tts_clone.py), and a
sentence's audio equals ``Qwen3TTSModel.generate_voice_clone`` for it. ``instructions``
become the model's instruct prompt (qwen-tts drops it for the 0.6B size, as its own
generate does). Sampling comes from the release's generation_config.json, then the
stage's options (``do_sample``, ``top_k``, ``temperature``, ... as qwen-tts names them).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from omni.engines.base import EngineLoadError
from omni.models.qwen3_tts_batch import Row, TalkerBatch
from omni.models.qwen3_tts_clone import (
    DEFAULT_CAPACITY,
    MAX_REFERENCE_S,
    MIN_REFERENCE_S,
    VoiceClones,
)
from omni.models.qwen3_tts_codec import CachedMaskDecoder, stage_torch_dtype
from omni.models.qwen3_tts_predictor import GraphedPredictor
from omni.models.qwen3_tts_stream import (
    LEFT_CONTEXT,
    SentenceStream,
    capture_prefill,
    fixed_frames,
    warm_decoder,
)
from omni.models.speech import (
    check_speed,
    ended_sentences,
    pick_voice,
    speech_output,
    split_sentences,
    texts,
    voice_entry,
)

# qwen-tts's generate() keywords a stage may set (its generation_config.json's keys)
SAMPLING_OPTIONS = frozenset({
    "do_sample", "top_k", "top_p", "temperature", "repetition_penalty", "subtalker_dosample",
    "subtalker_top_k", "subtalker_top_p", "subtalker_temperature", "max_new_tokens"})
DEFAULT_MAX_CHARS = 400  # longest sentence (characters) sent to the talker in one row
# audio within a sentence: the first chunk after 4 frames (320 ms of audio), then chunks
# twice as long up to 25 frames (2 s; as long as the left context decoded with each)
DEFAULT_FIRST_CHUNK_FRAMES, DEFAULT_CHUNK_FRAMES = 4, 25
# a whole seeded sentence's frames decode in chunks of qwen-tts's chunked_decode (300, with
# 25 of left context), so it sounds as that decode would
WHOLE_CHUNK_FRAMES = 300
# the largest talker batch whose code predictor runs as a graph (the engine's default
# max_batch_size; larger batches run transformers' generate)
GRAPH_MAX_BATCH = 64
SERVED_TYPES = ("custom_voice", "base")  # qwen-tts's tts_model_type values served here
def load_qwen3_tts(model_dir: str | os.PathLike[str], device: str, dtype: str) -> Any:
    """qwen-tts's Qwen3TTSModel for a release directory, on ``device``."""
    try:
        from qwen_tts import Qwen3TTSModel
    except ImportError as e:
        raise EngineLoadError("qwen3_tts: needs the 'qwen-tts' package, which pins "
                              "transformers 4.57.3: run the stage in its environment (env: "
                              "qwen3-tts; bash scripts/install_qwen3_tts_env.sh)") from e
    try:
        tts = Qwen3TTSModel.from_pretrained(str(model_dir), dtype=stage_torch_dtype(dtype, device))
    except (OSError, ValueError, TypeError) as e:
        raise EngineLoadError(f"qwen3_tts: cannot load {model_dir}: {e}") from e
    tts.model.to(device).eval()
    # its talker's generate ends at the codec's eos (qwen-tts's default) and transformers
    # pads finished rows with it: set here, not logged ("Setting pad_token_id ...") per request
    talker_generation = tts.model.talker.generation_config
    if talker_generation.pad_token_id is None:
        talker_generation.pad_token_id = tts.model.config.talker_config.codec_eos_token_id
    codec = tts.model.speech_tokenizer
    codec.model.to(device).eval()
    tts.device = codec.device = torch.device(device)
    return tts


def check_seed(seed: Any) -> int:
    """A request's seed: an integer a torch generator takes."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}")
    return seed


def _chunking(opts: Mapping[str, Any]) -> tuple[int, int]:
    """(first_chunk_frames, chunk_frames) of a stage's options, checked."""
    first = int(opts.get("first_chunk_frames", DEFAULT_FIRST_CHUNK_FRAMES))
    most = int(opts.get("chunk_frames", DEFAULT_CHUNK_FRAMES))
    if first < 1 or most < 0:
        raise EngineLoadError("qwen3_tts: first_chunk_frames must be >= 1 and chunk_frames >= 0 "
                              "(0: each sentence's audio whole, from qwen-tts's generate), got "
                              f"{first} and {most}")
    return first, most


class Qwen3TTSRunner:
    """Generation-engine runner (items mode): input ``text``, one output per sentence."""

    items = True
    input_key = "text"
    side_inputs = ("ref_audio",)  # a Base release's reference clip (joins the params)
    OPTIONS = SAMPLING_OPTIONS | {"max_chars", "openai_voices", "language", "clone_cache_size",
                                  "max_ref_seconds", "first_chunk_frames", "chunk_frames",
                                  "predictor_graphs"}

    def __init__(self, tts: Any, device: str, options: Mapping[str, Any]) -> None:
        self.tts = tts
        self.device = device
        opts = dict(options)
        self.max_chars = int(opts.pop("max_chars", DEFAULT_MAX_CHARS))
        self.openai_voices = bool(opts.pop("openai_voices", False))
        self.language = str(opts.pop("language", "auto"))
        self.sampling = {k: v for k, v in opts.items() if k in SAMPLING_OPTIONS}
        self.max_ref_s = float(opts.pop("max_ref_seconds", MAX_REFERENCE_S))
        self.stream_first_frames, self.stream_chunk_frames = _chunking(opts)
        self.streams_units = self.stream_chunk_frames > 0  # the engine's start_items/advance
        self.cuda = str(device).startswith("cuda")
        self._cached_decoder: CachedMaskDecoder | None = None
        self.graphed = self._graphed_predictor(bool(opts.pop("predictor_graphs", True)))
        # on a GPU, streamed chunk decodes take shapes met at load (qwen3_tts_stream.py)
        self.fixed_upto = 0
        if self.cuda and self._decoder() is not None:
            self.fixed_upto = fixed_frames(LEFT_CONTEXT + max(self.stream_chunk_frames, 1))
            warm_decoder(self._decoder(), int(tts.model.config.talker_config.num_code_groups),
                         device, self.fixed_upto, GRAPH_MAX_BATCH)
        capacity = int(opts.pop("clone_cache_size", DEFAULT_CAPACITY))
        self.clones = (VoiceClones(tts, capacity) if tts.model.tts_model_type == "base"
                       else None)
        codec = tts.model.speech_tokenizer
        self.sample_rate = int(codec.get_output_sample_rate())
        self.frame_samples = int(codec.get_decode_upsample_rate())
        # the speaker encoder's rate: a reference at it reaches both encoders unresampled
        self.reference_rate = int(tts.model.speaker_encoder_sample_rate)
        self._voices = self._list_voices()

    def _graphed_predictor(self, wanted: bool) -> GraphedPredictor | None:
        """The code predictor as CUDA graphs for the streamed talker (on a GPU, unless the
        stage's ``predictor_graphs: false``; omni/models/qwen3_tts_predictor.py)."""
        if not wanted or not self.cuda:
            return None
        return GraphedPredictor.of(self.tts.model, self._merged_sampling(), GRAPH_MAX_BATCH)

    # -- voices -----------------------------------------------------------------------
    def _list_voices(self) -> list[dict[str, Any]]:
        speakers = sorted(self.tts.model.get_supported_speakers() or ())
        return [voice_entry(s, s.capitalize(), self.language, self.sample_rate)
                for s in speakers]

    def voice(self, params: Mapping[str, Any]) -> str:
        if self.clones is not None:
            return ""  # the reference's voice; qwen-tts takes no speaker for it
        if params.get("ref_audio") is not None:
            raise ValueError("ref_audio: this Qwen3-TTS release speaks its own voices")
        if not self._voices:
            raise ValueError("voice: this Qwen3-TTS release has no built-in speakers")
        return pick_voice(params, self._voices)

    # -- units ------------------------------------------------------------------------
    def split(self, value: Any, params: Mapping[str, Any]) -> list[str]:
        if check_speed(params.get("speed", 1.0)) != 1.0:
            raise ValueError("speed: Qwen3-TTS speaks at its own pace (only 1.0)")
        self.voice(params)  # ValueError for an unknown voice
        if params.get("seed") is not None:
            check_seed(params["seed"])
        if self.clones is not None:
            self.clones.prompt(params)  # a bad reference fails its request alone, at once
        units = [s for part in texts(value) for s in split_sentences(part, self.max_chars)]
        if not units:
            raise ValueError("text has nothing to synthesize")
        return units

    def split_stream(self, text: str, params: Mapping[str, Any],
                     final: bool) -> tuple[list[str], str]:
        ready, held = (text, "") if final else ended_sentences(text)
        return (self.split(ready, params) if ready.strip() else []), held

    def group_key(self, params: Mapping[str, Any]) -> str:
        # each row of qwen-tts's generate has its own speaker, language and instruct
        return "all"

    def _generate(self, units: list[str], params: list[Mapping[str, Any]]) -> Any:
        """qwen-tts's own generate call for these sentences, not yet run."""
        languages = [self.language] * len(units)
        if self.clones is not None:
            prompts = [self.clones.prompt(p) for p in params]
            return lambda: self.tts.generate_voice_clone(
                list(units), language=languages, voice_clone_prompt=prompts, **self.sampling)
        instructs = [str(p.get("instructions") or "") for p in params]
        speakers = [self.voice(p) for p in params]
        return lambda: self.tts.generate_custom_voice(
            list(units), speaker=speakers, language=languages, instruct=instructs,
            **self.sampling)

    @torch.inference_mode()
    def start_items(self, units: list[str], params: list[Mapping[str, Any]]) -> SentenceStream:
        """A streamed call for these sentences, which later ones join (join_items)."""
        return self._stream(units, params, self.stream_first_frames, self.stream_chunk_frames)

    def _stream(self, units: list[str], params: list[Mapping[str, Any]], first_frames: int,
                chunk_frames: int) -> SentenceStream:
        job = SentenceStream(TalkerBatch(self.tts.model, self._merged_sampling(), self.graphed),
                             self._decoder(), first_frames, chunk_frames, self.fixed_upto)
        self.join_items(job, units, params)
        return job

    def _merged_sampling(self) -> dict[str, Any]:
        """The sampling arguments qwen-tts's generate_* pass on (the stage's options over
        generation_config.json over its defaults), from its own helper."""
        return self.tts._merge_generate_kwargs(**self.sampling)

    @torch.inference_mode()
    def join_items(self, job: SentenceStream, units: list[str],
                   params: list[Mapping[str, Any]]) -> None:
        """Sentences prefilled (qwen-tts's prompt) and added to the running call: they
        step with the others from the next advance on (omni/models/qwen3_tts_batch.py)."""
        prefill = capture_prefill(self.tts.model.talker, self._generate(units, params))
        rows = [Row(context=self._reference_codes(p), generator=self._generator(p))
                for p in params]
        job.join(prefill, rows, [self._text_tokens(u) for u in units])

    def _generator(self, params: Mapping[str, Any]) -> torch.Generator | None:
        """A seeded request's own random numbers (its audio is the same in any batch)."""
        seed = params.get("seed")
        if seed is None:
            return None
        return torch.Generator(self.device).manual_seed(check_seed(seed))

    def _decoder(self) -> Any:
        if self._cached_decoder is None:
            self._cached_decoder = CachedMaskDecoder(self.tts.model.speech_tokenizer.model.decoder)
        return self._cached_decoder

    @torch.inference_mode()
    def advance(self, job: SentenceStream) -> dict[int, tuple[Any, bool]]:
        return job.advance()

    def drop_items(self, job: SentenceStream, rows: list[int]) -> None:
        job.drop(rows)

    def _reference_codes(self, params: Mapping[str, Any]) -> torch.Tensor | None:
        """An in-context clone's reference codes: decoded before its sentence's frames."""
        return None if self.clones is None else self.clones.prompt(params).ref_code

    @torch.inference_mode()
    def run_items(self, units: list[str],
                  params: list[Mapping[str, Any]]) -> list[tuple[torch.Tensor, int]]:
        """Whole sentences: qwen-tts's generate, but sampled ones of seeded requests in
        the step loop, where each draws from its own generator (module docstring)."""
        sampled = any(self._merged_sampling()[k] for k in ("do_sample", "subtalker_dosample"))
        own = [i for i, p in enumerate(params) if sampled and p.get("seed") is not None]
        shared = [i for i in range(len(units)) if i not in own]
        out: dict[int, tuple[torch.Tensor, int]] = {}
        for rows, run in ((shared, self._run_generate), (own, self._run_seeded)):
            if rows:
                results = run([units[i] for i in rows], [params[i] for i in rows])
                out.update(zip(rows, results, strict=True))
        return [out[i] for i in range(len(units))]

    def _run_generate(self, units: list[str],
                      params: list[Mapping[str, Any]]) -> list[tuple[torch.Tensor, int]]:
        wavs, _ = self._generate(units, params)()
        out = []
        for unit, wav in zip(units, wavs, strict=True):
            audio = torch.as_tensor(wav, dtype=torch.float32).reshape(-1)
            out.append((audio, self._text_tokens(unit)))
        return out

    def _run_seeded(self, units: list[str],
                    params: list[Mapping[str, Any]]) -> list[tuple[torch.Tensor, int]]:
        """The sentences run to their ends in the step loop (qwen3_tts_batch.py), each
        with its request's generator, their chunks joined."""
        job = self._stream(units, params, WHOLE_CHUNK_FRAMES, WHOLE_CHUNK_FRAMES)
        pieces: list[list[torch.Tensor]] = [[] for _ in units]
        tokens = [0] * len(units)
        while not job.done:
            for n, ((wav, n_tokens), _) in job.advance().items():
                pieces[n].append(wav)
                tokens[n] += n_tokens
        return [(torch.cat(p), n) for p, n in zip(pieces, tokens, strict=True)]

    def _text_tokens(self, text: str) -> int:
        return len(self.tts.processor.tokenizer(text, add_special_tokens=False)["input_ids"])

    def pack(self, result: tuple[torch.Tensor, int]) -> dict[str, Any]:
        audio, n_tokens = result
        frames = -(-int(audio.numel()) // self.frame_samples)
        return speech_output(audio, self.sample_rate, n_tokens, frames)

    def info(self) -> dict[str, Any]:
        model = self.tts.model
        return {"model": "qwen3_tts", "sample_rate": self.sample_rate, "voices": self._voices,
                "openai_voice_alias": (self._voices[0]["id"]
                                       if self.openai_voices and self._voices else None),
                "tts_model_type": model.tts_model_type, "device": self.device,
                "dtype": str(model.dtype).removeprefix("torch."), "audio_format": "f32le",
                "sampling": dict(self.sampling), **self._clone_info()}

    def _clone_info(self) -> dict[str, Any]:
        """A Base release's reference limits (omni/api/speech_reference.py reads them)."""
        if self.clones is None:
            return {}
        return {"voice_clone": {"sample_rate": self.reference_rate, "min_seconds": MIN_REFERENCE_S,
                                "max_seconds": self.max_ref_s, "cached": self.clones.capacity}}


class Qwen3TTSTalkerRunner(Qwen3TTSRunner):
    """The split layout's talker stage: sentences in, codec codes out, streamed in
    chunks ({"codes": (groups, n) int64}) to a code2wav stage (qwen3_tts_codec.py) that
    decodes them with left context. A Base release's in-context clone (ref_text given)
    sends its reference's last codes with each sentence's first chunk ({"context": (groups,
    t)}): the code2wav stage decodes the sentence's first frames after them, as qwen-tts
    decodes reference + new codes, so each sentence's audio is the fused layout's."""

    def __init__(self, tts: Any, device: str, options: Mapping[str, Any]) -> None:
        super().__init__(tts, device, options)
        if not self.streams_units:
            raise EngineLoadError("qwen3_tts_talker: chunk_frames must be >= 1 (it streams "
                                  "codes to the code2wav stage)")

    def _decoder(self) -> None:
        return None  # chunks are codes

    def pack(self, result: tuple[torch.Tensor, int, torch.Tensor | None]) -> dict[str, Any]:
        codes, n_tokens, context = result
        return {"codes": codes, "input_tokens": int(n_tokens),
                **({} if context is None else {"context": context})}

    def info(self) -> dict[str, Any]:
        return {**super().info(), "model": "qwen3_tts_talker", "audio_format": None}


def build_qwen3_tts_talker_runner(*, model_dir: str, device: str, dtype: str,
                                  options: Mapping[str, Any]) -> Qwen3TTSTalkerRunner:
    return Qwen3TTSTalkerRunner(load_qwen3_tts(model_dir, device, dtype), device, options)


def build_qwen3_tts_runner(*, model_dir: str, device: str, dtype: str,
                           options: Mapping[str, Any]) -> Qwen3TTSRunner:
    tts = load_qwen3_tts(model_dir, device, dtype)
    if tts.model.tts_model_type not in SERVED_TYPES:
        raise EngineLoadError(f"qwen3_tts: {model_dir} is a {tts.model.tts_model_type!r} "
                              "release; this stage serves CustomVoice and Base releases")
    return Qwen3TTSRunner(tts, device, options)

