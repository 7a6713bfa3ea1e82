"""Qwen3-TTS's talker on the AR engine: paged KV cache, continuous batching, CUDA graphs.

The generation-engine stage (qwen3_tts.py, qwen3_tts_batch.py) steps qwen-tts's own talker
forward over one left-padded, concatenated KV cache: every step is transformers' eager
forward plus a cache that grows by concatenation, a few hundred small kernels launched from
Python per layer. This adapter runs the same talker as a feedback AR stage
(omni/engines/ar/feedback.py), so its decode steps are the engine's: one packed forward
over every running sentence, paged attention, decode steps replayed from CUDA graphs, and
the code predictor's 15 passes as one more graph per step.

What qwen-tts's generate does, as this feed does it:
- Prompt: qwen-tts's own, taken from its ``generate_custom_voice`` (what it gives the
  talker's generate, qwen3_tts_stream.capture_talker_inputs): the prompt embeddings, the trailing text
  (projected text tokens fed one a frame) and the pad embedding after it. With qwen-tts's
  defaults a CustomVoice prompt holds the whole text (``non_streaming_mode=True``: the
  trailing text is the pad embedding alone); a voice clone's holds the first text token
  and trails the rest. Either way the whole text is needed before the prefill, so a text
  stage's stream is spoken once it ends.
- Decode step g: the summed codec embeddings of frame g (the sampled first code + the code
  predictor's 15) + trailing text g, or the pad embedding once the text is spent (the
  talker's forward; here computed by the feed after each sampled code, as Qwen3-Omni's).
- The first code: ``codec_head`` with the codec's 1024 special ids suppressed except
  end-of-speech; repetition penalty, temperature, top-k and top-p as the engine samples any
  AR stage (the release's generation_config.json gives the defaults); at least two codes
  (qwen-tts's min_new_tokens=2): min_tokens 2.
- Frames: qwen-tts keeps the frames completed before end-of-speech; with
  ``max_new_tokens`` N and no end it keeps N - 1 (the last code's frame is never completed).
  So the defaults' ``max_tokens`` is N - 1 and each sampled code's frame leaves at once.
- Positions: a single row's rotary positions are 0, 1, 2, ... on all three axes (qwen-tts's
  get_rope_index of an unpadded mask), the engine's own.

Greedy codes equal qwen-tts's generate for the same text and speaker (tests/http/
test_qwen3_tts_ar.py). Sampled ones follow the same warpers with the engine's draws (a
request's ``seed``: the same audio alone and in any batch), not transformers'
multinomial on the global RNG.

CustomVoice releases speak their speakers (``voice``; ``instructions``). A Base release
clones the voice of each request's reference clip (``ref_audio`` input, ``ref_text``
param): the prompt is qwen-tts's ``generate_voice_clone``'s, built from the prompt item
qwen3_tts_clone.VoiceClones keeps per distinct reference, and an in-context clone's first
frame carries the reference's last codes (``"context"``), which the code2wav stage decodes
as left context before it, as qwen-tts decodes reference + new codes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from omni.engines.base import EngineLoadError, flag_option
from omni.models.causal_lm import CausalLM, _is_random, cache_keyword
from omni.models.codec_talker import CodecInputs, CodecTalkerLM
from omni.models.predictor_kv import predict_static, supported
from omni.models.qwen3_omni_predictor import PredictorGraphs, make_graphs, predict_uncached
from omni.models.qwen3_tts import SERVED_TYPES, check_seed, load_qwen3_tts
from omni.models.qwen3_tts_batch import suppressed
from omni.models.qwen3_tts_clone import (
    DEFAULT_CAPACITY,
    MAX_REFERENCE_S,
    MIN_REFERENCE_S,
    VoiceClones,
)
from omni.models.qwen3_tts_stream import LEFT_CONTEXT, capture_talker_inputs, snapshot_config
from omni.models.speech import check_speed, voice_entry

# stage options this adapter reads beside the AR engine's (the talker's own sampling is the
# requests' params: temperature, top_k, top_p, repetition_penalty, max_tokens)
OPTIONS = frozenset({"language", "openai_voices", "subtalker_dosample", "subtalker_top_k",
                     "subtalker_top_p", "subtalker_temperature", "predictor_compile",
                     "predictor_kv_cache", "predictor_compile_unit",
                     "clone_cache_size", "max_ref_seconds"})
MIN_CODES = 2  # qwen-tts's min_new_tokens


class TalkerLM(CodecTalkerLM):
    """qwen-tts's talker as the AR engine calls it (codec_talker.py), the codec's special
    ids suppressed but end-of-speech."""

    def __init__(self, talker: Any, eos: int) -> None:
        vocab = int(talker.config.vocab_size)
        mask = torch.zeros(vocab, dtype=torch.bool, device=talker.codec_head.weight.device)
        mask[suppressed(eos, vocab)] = True
        super().__init__(talker, mask)

    def set_attn_implementation(self, name: str) -> None:
        """The engine's attention for the talker; the code predictor keeps its own
        (transformers 4.57 hands a config's attention down to its sub-configs, and the
        predictor's config is one of the talker's)."""
        predictor = self.talker.code_predictor
        own = predictor.config._attn_implementation
        self.talker.model.config._attn_implementation = name
        for config in {id(c): c for c in (predictor.config, predictor.model.config)}.values():
            config._attn_implementation = own


@dataclass
class FeedState:
    """One request: its text and voice, then qwen-tts's prompt, then the last frame."""

    text: str = ""
    instructions: str = ""
    reference: Any = None  # a Base release's reference clip ({pcm_f32le, sample_rate})
    ref_text: str | None = None  # its transcript (in-context clone) or None (embedding only)
    context: torch.Tensor | None = None  # (groups, t) reference codes, sent with frame 0
    trailing: torch.Tensor | None = None  # (W, H): one projected text token per frame
    pad: torch.Tensor | None = None  # (H,): the text input once the trailing text is spent
    closed: bool = False
    next_codec: torch.Tensor | None = None  # summed codec embeddings of the last frame
    frame: FrameCodes | None = None  # the last step's frames (this request's: frame_row)
    frame_row: int = 0
    generator: torch.Generator | None = None

    @property
    def codes(self) -> list[int]:
        """The last frame's codes, one per code group (waits for the predictor's pass)."""
        return self.frame.rows()[self.frame_row]


class FrameCodes:
    """A step's frames (rows x code groups), on their way to the host.

    The step's one wait for the device was a ``.tolist()`` of the frames right after the
    code predictor, before the engine scheduled and launched the next talker step: the GPU
    idled for all of that host work. The copy is queued right behind the predictor (pinned
    memory, an event) and read when the frames' outputs are built, which the engine does
    after launching the next step (omni/engines/ar/steps.py: overlap), so that step's graph
    is already queued behind the predictor. (H100, in-process, B=64: the GPU was busy
    6.5 ms of a 12.7 ms profiled step: bench/results/qwen3-tts-gpu.md, session 16.)"""

    def __init__(self, frames: torch.Tensor) -> None:
        self._event = None
        self._host = frames
        self._rows: list[list[int]] | None = None
        if frames.is_cuda:
            self._host = torch.empty(frames.shape, dtype=frames.dtype, pin_memory=True)
            self._host.copy_(frames, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()

    def rows(self) -> list[list[int]]:
        if self._rows is None:
            if self._event is not None:
                self._event.synchronize()
            self._rows = self._host.tolist()
        return self._rows


class TTSFeed(CodecInputs):
    """Builds the talker's inputs and runs its code predictor (the module doc)."""

    OPTIONS = OPTIONS  # the stage options it reads (the engine checks them before loading)
    # a first stage: it reads the request's text (and a clone's reference), not a stage's
    request_inputs = frozenset({"text"})

    def __init__(self, tts: Any, options: Mapping[str, Any]) -> None:
        self.tts, self.model = tts, tts.model
        self.lm = TalkerLM(self.model.talker, int(self.model.config.talker_config.codec_eos_token_id))
        self.cfg = self.model.config.talker_config
        self.groups = int(self.cfg.num_code_groups)
        self.language = str(options.get("language", "auto"))
        self.openai_voices = flag_option(options, "openai_voices", False)
        self.sampling = tts._merge_generate_kwargs(**{k: v for k, v in options.items()
                                                     if k.startswith("subtalker_")})
        self.predictor_greedy = not self.sampling["subtalker_dosample"]
        self.pick = {"top_k": int(self.sampling["subtalker_top_k"] or 0),
                     "top_p": float(self.sampling["subtalker_top_p"] or 1.0),
                     "temperature": float(self.sampling["subtalker_temperature"] or 1.0)}
        self.graphs: PredictorGraphs | None = None  # use_cuda_graphs
        # the predictor's layers compiled inside its graphs (qwen3_omni_predictor.py; H100,
        # in-process: its share of a step at B=8 12.7 -> 5.5 ms, bench/results/
        # qwen3-tts-ar-step-h100.md)
        self.predictor_compile = flag_option(options, "predictor_compile", True)
        # what one torch.compile covers in the static-KV loop: "pass" (a whole pass, fused
        # across layers) or "layer" (a layer step and the pass tail; PredictorGraphs). H100,
        # same call, served c=1 / 8 / 64: layer 9.69 / 60.94 / 221.50 audio-s/s, pass
        # 11.52 / 73.54 / 254.47 (that layer run had hit dynamo's recompile limit, since
        # fixed: bench/results/qwen3-tts-gpu.md, session 15)
        self.compile_unit = str(options.get("predictor_compile_unit", "pass"))
        if self.compile_unit not in ("layer", "pass"):
            raise EngineLoadError(f"predictor_compile_unit: 'pass' or 'layer', not "
                                  f"{self.compile_unit!r}")
        # each predictor pass reads the frame's earlier positions from a static KV cache
        # instead of recomputing them (omni/models/predictor_kv.py). Default on a GPU: H100,
        # in its graphs, compiled, a frame at B=64 10.45 -> 6.61 ms; served c=64 206.5 ->
        # 239.7 audio-s/s (bench/results/qwen3-tts-gpu.md); on the CPU not measured apart
        # from noise, so the loop stays the uncached one there
        cp = self.model.talker.code_predictor
        on_gpu = cp.lm_head[0].weight.device.type == "cuda"
        self.predictor_kv = (flag_option(options, "predictor_kv_cache", on_gpu)
                             and supported(cp))
        codec = self.model.speech_tokenizer
        self.sample_rate = int(codec.get_output_sample_rate())
        self.speakers = sorted(self.model.get_supported_speakers() or ())
        self.clones = (VoiceClones(tts, int(options.get("clone_cache_size", DEFAULT_CAPACITY)))
                       if self.model.tts_model_type == "base" else None)
        self.max_ref_s = float(options.get("max_ref_seconds", MAX_REFERENCE_S))

    # -- the engine's contract --------------------------------------------------------
    def voice(self, name: Any) -> str:
        if self.clones is not None:
            return ""  # the reference's voice (the SDK always sends a name: not checked)
        if name is None:
            return self.speakers[0]
        if not isinstance(name, str) or name not in self.speakers:
            raise ValueError(f"unknown voice {name!r} (valid: {', '.join(self.speakers)})")
        return name

    def new_state(self, seed: int | None, device: torch.device) -> FeedState:
        generator = None if seed is None else torch.Generator(device).manual_seed(
            check_seed(seed) + 1)  # +1: not the talker sampler's own stream
        return FeedState(generator=generator)

    def configure(self, st: FeedState, params: Mapping[str, Any]) -> None:
        """A request's speech params, checked: ValueError fails it alone."""
        if check_speed(params.get("speed", 1.0)) != 1.0:
            raise ValueError("speed: Qwen3-TTS speaks at its own pace (only 1.0)")
        st.instructions = str(params.get("instructions") or "")
        st.ref_text = str(params["ref_text"]) if params.get("ref_text") else None

    def info(self) -> dict[str, Any]:
        voices = [voice_entry(s, s.capitalize(), self.language, self.sample_rate)
                  for s in self.speakers]
        clone = {} if self.clones is None else {"voice_clone": {
            "sample_rate": int(self.model.speaker_encoder_sample_rate),
            "min_seconds": MIN_REFERENCE_S, "max_seconds": self.max_ref_s,
            "cached": self.clones.capacity}}
        return {"voices": voices, "sample_rate": self.sample_rate,
                "openai_voice_alias": voices[0]["id"] if self.openai_voices and voices else None,
                "num_code_groups": self.groups, "tts_model_type": self.model.tts_model_type,
                "subtalker_sampling": {"dosample": not self.predictor_greedy, **self.pick},
                **clone}

    @staticmethod
    def frame_output(st: FeedState, codes: list[int]) -> dict[str, Any]:
        """One frame as the code2wav stage takes it: (groups, 1); an in-context clone's
        first frame with its reference codes (the code2wav stage's left context)."""
        context, st.context = st.context, None
        return {"codes": [[c] for c in codes], **({} if context is None else {"context": context})}

    # -- input ------------------------------------------------------------------------
    def take(self, st: FeedState, data: Mapping[str, Any]) -> None:
        """The request's text, or a piece of an upstream stage's streamed text."""
        text = data.get("text", "")
        if isinstance(text, list):  # the speech API's parts
            text = "".join(str(t) for t in text)
        if not isinstance(text, str):
            raise ValueError(f"text must be a string, got {type(text).__name__}")
        st.text += text
        if data.get("ref_audio") is not None:
            if self.clones is None:
                raise ValueError("ref_audio: this Qwen3-TTS release speaks its own voices")
            st.reference = data["ref_audio"]

    def prefill(self, st: FeedState, speaker: str) -> tuple[torch.Tensor, None] | None:
        """qwen-tts's prompt for the whole text, once it is all here (module doc)."""
        if not st.closed:
            return None
        if not st.text.strip():
            raise ValueError("text has nothing to synthesize")
        with torch.inference_mode():
            call = self._generate(st, speaker)  # a clone's reference prompt: the real config
            with snapshot_config(self.model):
                prompt = capture_talker_inputs(self.model.talker, call)
        st.trailing = prompt["trailing_text_hidden"][0]
        st.pad = prompt["tts_pad_embed"].reshape(-1)
        return prompt["inputs_embeds"][0], None

    def _generate(self, st: FeedState, speaker: str) -> Any:
        """qwen-tts's own generate call for this request, not yet run."""
        if self.clones is None:
            return lambda: self.tts.generate_custom_voice(
                [st.text], speaker=[speaker], language=[self.language],
                instruct=[st.instructions], **self.sampling)
        item = self.clones.prompt({"ref_audio": st.reference, "ref_text": st.ref_text})
        if item.ref_code is not None:  # in-context: decoded before the first frame
            st.context = item.ref_code[-LEFT_CONTEXT:].T.contiguous().cpu().clamp(min=0)
        return lambda: self.tts.generate_voice_clone(
            [st.text], language=[self.language], voice_clone_prompt=[item], **self.sampling)

    def ready(self, st: FeedState, step: int) -> bool:
        return True  # the whole text was known at the prefill

    def text_input(self, st: FeedState, step: int) -> torch.Tensor:
        """The text embedding decode step ``step`` reads: the prompt's trailing text, then
        the pad embedding."""
        return st.trailing[step] if step < len(st.trailing) else st.pad

    # -- after sampling ---------------------------------------------------------------
    @torch.inference_mode()
    def feedback(self, states: list[FeedState], tokens: list[int], rows: list[int],
                 greedy: list[bool]) -> None:
        """The residual codes of each sampled first code, and the next step's input."""
        if not states:
            return
        dev = self.lm.suppressed.device
        first = torch.tensor(tokens, device=dev)
        first_embed = self.lm.get_input_embeddings()(first)
        hidden = self.lm.last_hidden[torch.tensor(rows, dtype=torch.long, device=dev)]
        is_greedy = [g or self.predictor_greedy for g in greedy]
        draws = self._uniforms(states, is_greedy, dev)
        is_greedy = torch.tensor(is_greedy, device=dev)
        done = None if self.graphs is None else self.graphs.run(hidden, first_embed, draws,
                                                                is_greedy)
        cp = self.model.talker.code_predictor
        loop = predict_static if self.predictor_kv else predict_uncached
        residual, total = done or loop(cp, hidden, first_embed, draws, is_greedy,
                                       project=cp.small_to_mtp_projection, sampling=self.pick)
        frame = FrameCodes(torch.cat((first[:, None], residual), dim=1))
        for i, st in enumerate(states):
            st.frame, st.frame_row, st.next_codec = frame, i, total[i]

    def _uniforms(self, states: list[FeedState], greedy: list[bool],
                  dev: torch.device) -> torch.Tensor:
        """(B, groups-1) uniform draws for the predictor's picks: a seeded request's from its
        own generator (the same codes in any batch), the others' in one call on the global
        RNG (a call per row cost a launch each at 64 rows); none where every pick is greedy."""
        n = self.groups - 1
        if all(greedy):
            return torch.zeros(len(states), n, device=dev)
        draws = torch.rand(len(states), n, device=dev)
        for i, st in enumerate(states):
            if st.generator is not None and not greedy[i]:
                draws[i] = torch.rand(n, device=dev, generator=st.generator)
        return draws

    def reserve(self, rows: int) -> None:
        self.lm.reserve(rows)

    def use_cuda_graphs(self, max_batch: int) -> bool:
        """The code predictor's loop as one CUDA graph per padded batch size."""
        emb = self.lm.get_input_embeddings().weight
        if emb.device.type != "cuda":
            return False
        cp = self.model.talker.code_predictor
        self.graphs = make_graphs(cp, emb.shape[1], self.groups, emb.dtype, emb.device,
                                  max_batch, compiled=self.predictor_compile,
                                  project=cp.small_to_mtp_projection, sampling=self.pick,
                                  kv_cache=self.predictor_kv, compile_unit=self.compile_unit)
        return self.graphs is not None


def sampling_defaults(sampling: Mapping[str, Any]) -> dict[str, Any]:
    """qwen-tts's merged generate arguments as the engine's request params (module doc:
    max_tokens is max_new_tokens - 1 frames)."""
    return {"temperature": float(sampling["temperature"]) if sampling["do_sample"] else 0.0,
            "top_k": int(sampling["top_k"] or 0), "top_p": float(sampling["top_p"]),
            "repetition_penalty": float(sampling["repetition_penalty"]),
            "max_tokens": max(1, int(sampling["max_new_tokens"]) - 1), "min_tokens": MIN_CODES}


def load_talker(*, model_dir: str, device: str, dtype: str,
                options: Mapping[str, Any]) -> tuple[CausalLM, TTSFeed]:
    """A CustomVoice or Base release's talker as (CausalLM for the engine, feed)."""
    from pathlib import Path

    tts = load_qwen3_tts(model_dir, device, dtype)
    if tts.model.tts_model_type not in SERVED_TYPES:
        raise EngineLoadError(f"qwen3_tts_ar_talker: {model_dir} is a "
                              f"{tts.model.tts_model_type!r} release; this stage serves "
                              "CustomVoice and Base releases")
    tts.model.requires_grad_(False)  # inference only (and torch.compile traces no backward)
    feed = TTSFeed(tts, {k: v for k, v in options.items() if k in OPTIONS})
    talker = tts.model.talker
    cfg = talker.config
    lm = CausalLM(model=feed.lm, tokenizer=None, eos_token_ids={int(cfg.codec_eos_token_id)},
                  model_dir=str(model_dir), dtype=talker.codec_head.weight.dtype,
                  device=torch.device(device), random_weights=_is_random(Path(model_dir)),
                  config=cfg, cache_kwarg=cache_keyword(talker.model.forward),
                  sampling_defaults=sampling_defaults(tts._merge_generate_kwargs()))
    return lm, feed
