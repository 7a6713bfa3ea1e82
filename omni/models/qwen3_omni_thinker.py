"""Qwen3-Omni-MoE's thinker for the AR engine: text and audio in, text out.

Quirks (reference/models.md 2a): a release is one combined checkpoint; loading the
thinker alone works through ``Qwen3OmniMoeForConditionalGeneration`` with
``enable_audio_output = False`` (no talker, no code2wav built). The thinker's shapes are
in ``config.thinker_config.text_config``; its forward takes 2-D text position ids (it
expands them to its multimodal rotary layout itself) but not ``logits_to_keep``, so the
engine picks the rows it needs from the full logits. Only the text model gets the
engine's attention; the audio and vision towers keep theirs.

Audio input (`ThinkerMedia`): what the release's processor does, without its image/video
processors (they need torchvision): each audio part becomes <|audio_start|>, N x
<|audio_pad|>, <|audio_end|> with N from the audio encoder's length rule, and the audio
tower's outputs replace the pads' embeddings; the prompt then goes to the engine as
embeddings with its real ids (the talker reads them). Audio tokens take consecutive
rotary positions like text (get_rope_index gives them arange too), so the engine's 1-D
positions are exact. Images and video need 3-D rotary positions: not supported yet.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np

from omni.engines.base import EngineLoadError
from omni.models.hf_causal import CausalLM, _is_random, _resolve_dtype, cache_keyword, eos_ids

AUDIO_PARTS = ("input_audio",)
UNSUPPORTED_PARTS = ("image_url", "video_url", "image", "video")


class ThinkerMedia:
    """Builds (ids, embeddings) of a chat prompt holding decoded audio parts."""

    def __init__(self, thinker: Any, tokenizer: Any, feature_extractor: Any, config: Any):
        self.thinker, self.tokenizer, self.fe = thinker, tokenizer, feature_extractor
        self.audio_id = int(config.thinker_config.audio_token_id)
        self.n_window = int(config.thinker_config.audio_config.n_window)

    def info(self) -> dict[str, Any]:
        return {"input_audio_rate": int(self.fe.sampling_rate),
                "input_parts": ["text", "input_audio", "audio_url"]}

    @staticmethod
    def wants(messages: Any) -> bool:
        return isinstance(messages, list) and any(
            isinstance(part, dict) and part.get("type") in AUDIO_PARTS + UNSUPPORTED_PARTS
            for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list)
            for part in m["content"])

    def encode(self, messages: list[dict[str, Any]]) -> tuple[list[int], Any]:
        import torch
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            _get_feat_extract_output_lengths,
        )

        clips, rendered = [], []
        for m in messages:
            content = m.get("content")
            if isinstance(content, list):
                content = [self._part(p, clips) for p in content]
            rendered.append({**m, "content": content})
        text = self.tokenizer.apply_chat_template(rendered, add_generation_prompt=True,
                                                  tokenize=False)
        ids = self.tokenizer(text)["input_ids"]
        feats = self.fe(clips, sampling_rate=self.fe.sampling_rate, padding=True,
                        truncation=False, return_attention_mask=True, return_tensors="pt")
        mask = feats["attention_mask"]
        counts = _get_feat_extract_output_lengths(mask.sum(-1), self.n_window).tolist()
        if ids.count(self.audio_id) != len(clips):
            raise ValueError("the chat template did not place one audio token per audio part")
        expanded: list[int] = []
        pads = iter(counts)
        for t in ids:
            expanded += [t] * int(next(pads)) if t == self.audio_id else [t]
        dev = self.thinker.device
        with torch.inference_mode():
            audio = self.thinker.get_audio_features(
                feats["input_features"].to(dev, self.thinker.dtype),
                mask.to(dev)).last_hidden_state
            ids_t = torch.tensor(expanded, device=dev)
            embeds = self.thinker.get_input_embeddings()(ids_t)
            embeds[ids_t == self.audio_id] = audio.to(embeds.dtype)
        return expanded, embeds

    @staticmethod
    def _part(part: Any, clips: list[np.ndarray]) -> Any:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in UNSUPPORTED_PARTS:
            raise ValueError(f"'{kind}' content parts are not supported by this model yet "
                             "(text and audio are)")
        if kind != "input_audio":
            return part
        audio = part.get("input_audio") or {}
        if not isinstance(audio.get("pcm_f32le"), bytes):
            raise ValueError("an input_audio part reached the engine undecoded")
        clips.append(np.frombuffer(audio["pcm_f32le"], dtype=np.float32))
        return {"type": "audio"}


@contextlib.contextmanager
def _quiet_transformers() -> Any:
    """transformers at ERROR level for a while: loading the thinker from the combined
    directory makes it print a table of the other stages' keys (missing thinker keys are
    checked here instead)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def load_thinker(path: Path, dtype: str, device: str) -> CausalLM:
    import torch
    from transformers import (
        AutoConfig,
        AutoTokenizer,
        Qwen3OmniMoeForConditionalGeneration,
        WhisperFeatureExtractor,
    )

    dev = torch.device(device)
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        config.enable_audio_output = False  # build the thinker only
        text_config = config.thinker_config.text_config
        torch_dtype = _resolve_dtype(dtype, dev, text_config)
        with _quiet_transformers():  # it lists every talker/code2wav key as unexpected
            model, info = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
                str(path), config=config, dtype=torch_dtype, local_files_only=True,
                output_loading_info=True)
    except Exception as e:
        raise EngineLoadError(f"model directory {path}: cannot load the Qwen3-Omni thinker: "
                              f"{e}") from e
    missing = sorted(k for k in info.get("missing_keys") or [] if k.startswith("thinker."))
    if missing:
        raise EngineLoadError(f"model directory {path}: thinker weights missing {missing[:8]}; "
                              "refusing to run with randomly initialised weights")
    thinker = model.thinker.to(dev).eval()
    thinker.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    media = None
    if (path / "preprocessor_config.json").is_file():  # the audio feature extractor
        fe = WhisperFeatureExtractor.from_pretrained(str(path), local_files_only=True)
        media = ThinkerMedia(thinker, tokenizer, fe, config)
    return CausalLM(model=thinker, tokenizer=tokenizer,
                    eos_token_ids=eos_ids(path, text_config, tokenizer), model_dir=str(path),
                    dtype=torch_dtype, device=dev, random_weights=_is_random(path),
                    config=text_config, cache_kwarg=cache_keyword(thinker.forward),
                    attn_subconfig="text_config",
                    keeps_logits=False,
                    export_layers=[0, int(config.talker_config.accept_hidden_layer)],
                    media=media)
