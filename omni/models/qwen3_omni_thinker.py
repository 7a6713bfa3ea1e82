"""Qwen3-Omni-MoE's thinker for the AR engine: text, audio and images in, text out.

Quirks (reference/models.md 2a): a release is one combined checkpoint; loading the
thinker alone works through ``Qwen3OmniMoeForConditionalGeneration`` with
``enable_audio_output = False`` (no talker, no code2wav built). The thinker's shapes are
in ``config.thinker_config.text_config``; its forward takes 2-D text position ids (it
expands them to its multimodal rotary layout itself) but not ``logits_to_keep``, so the
engine picks the rows it needs from the full logits. Only the text model gets the
engine's attention; the audio and vision towers keep theirs.

Media input (`ThinkerMedia`): what the release's processor does, without its video
processor (it needs torchvision): each audio part becomes <|audio_start|>, N x
<|audio_pad|>, <|audio_end|> with N from the audio encoder's length rule, each image
<|vision_start|>, M x <|image_pad|>, <|vision_end|> with M from its patch grid
(omni/models/qwen3_omni_vision.py), and the towers' outputs replace the pads'
embeddings; the prompt then goes to the engine as embeddings with its real ids (the
talker reads them). Audio tokens take consecutive rotary positions like text
(get_rope_index gives them arange too), so an audio-only prompt keeps 1-D positions; a
prompt with images gets the model's 3-axis positions and deepstack features
(a `PromptLayout`, omni/engines/ar_media.py), and exports its positions to the talker.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np

from omni.engines.ar_media import PromptLayout
from omni.engines.base import EngineLoadError
from omni.models.hf_causal import CausalLM, _is_random, _resolve_dtype, cache_keyword, eos_ids
from omni.models.qwen3_omni_vision import (
    IMAGE_PARTS,
    TextFirstRope,
    decode_image,
    encode_images,
    install_deepstack,
    rope_index,
)

AUDIO_PARTS = ("input_audio",)
UNSUPPORTED_PARTS = ("video_url", "video", "image_url")  # image_url: the API decodes it


class ThinkerMedia:
    """Builds (ids, embeddings, layout) of a chat prompt holding decoded media parts."""

    def __init__(self, thinker: Any, tokenizer: Any, feature_extractor: Any,
                 image_processor: Any, config: Any):
        self.thinker, self.tokenizer, self.fe = thinker, tokenizer, feature_extractor
        self.images = image_processor
        self.audio_id = int(config.thinker_config.audio_token_id)
        self.image_id = int(config.thinker_config.image_token_id)
        self.n_window = int(config.thinker_config.audio_config.n_window)

    def info(self) -> dict[str, Any]:
        parts = ["text", "input_audio", "audio_url"] + (["image_url"] if self.images else [])
        return {"input_audio_rate": int(self.fe.sampling_rate), "input_parts": parts}

    @staticmethod
    def wants(messages: Any) -> bool:
        kinds = AUDIO_PARTS + IMAGE_PARTS + UNSUPPORTED_PARTS
        return isinstance(messages, list) and any(
            isinstance(part, dict) and part.get("type") in kinds
            for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list)
            for part in m["content"])

    def encode(self, messages: list[dict[str, Any]]) -> tuple[list[int], Any, Any]:
        import torch

        clips: list[np.ndarray] = []
        images: list[Any] = []
        rendered = []
        for m in messages:
            content = m.get("content")
            if isinstance(content, list):
                content = [self._part(p, clips, images) for p in content]
            rendered.append({**m, "content": content})
        text = self.tokenizer.apply_chat_template(rendered, add_generation_prompt=True,
                                                  tokenize=False)
        ids = self.tokenizer(text)["input_ids"]
        audio = self._audio(clips) if clips else None
        with torch.inference_mode():
            vision = encode_images(self.thinker, self.images, images) if images else None
        for token, found, want in ((self.audio_id, ids.count(self.audio_id), len(clips)),
                                   (self.image_id, ids.count(self.image_id), len(images))):
            if found != want:
                raise ValueError(f"the chat template placed {found} of token {token} for "
                                 f"{want} media parts")
        pads = {self.audio_id: iter(audio["tokens"] if audio else []),
                self.image_id: iter(vision["tokens"] if vision else [])}
        expanded: list[int] = []
        for t in ids:
            expanded += [t] * int(next(pads[t])) if t in pads else [t]
        dev = self.thinker.device
        with torch.inference_mode():
            ids_t = torch.tensor(expanded, device=dev)
            embeds = self.thinker.get_input_embeddings()(ids_t)
            if audio:
                embeds[ids_t == self.audio_id] = audio["embeds"].to(embeds.dtype)
            if vision:
                embeds[ids_t == self.image_id] = vision["embeds"].to(embeds.dtype)
        if not vision:
            return expanded, embeds, None
        rope, delta = rope_index(self.thinker, expanded, vision["grid"],
                                 audio["lengths"] if audio else None)
        return expanded, embeds, PromptLayout(
            rope, delta, visual_mask=(ids_t == self.image_id).cpu(),
            deepstack=vision["deepstack"], exports={"prompt_rope_positions": rope.tolist()})

    def _audio(self, clips: list[np.ndarray]) -> dict[str, Any]:
        """The audio tower's embeddings of `clips` and each clip's token count."""
        import torch
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            _get_feat_extract_output_lengths,
        )

        feats = self.fe(clips, sampling_rate=self.fe.sampling_rate, padding=True,
                        truncation=False, return_attention_mask=True, return_tensors="pt")
        mask = feats["attention_mask"]
        lengths = mask.sum(-1)
        dev = self.thinker.device
        with torch.inference_mode():
            embeds = self.thinker.get_audio_features(
                feats["input_features"].to(dev, self.thinker.dtype),
                mask.to(dev)).last_hidden_state
        return {"embeds": embeds, "lengths": lengths,
                "tokens": _get_feat_extract_output_lengths(lengths, self.n_window).tolist()}

    def _part(self, part: Any, clips: list[np.ndarray], images: list[Any]) -> Any:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in UNSUPPORTED_PARTS:
            raise ValueError(f"'{kind}' content parts are not supported by this model yet "
                             "(text, audio and images are)")
        if kind == "image":
            if self.images is None:
                raise ValueError("this model directory has no image processor config")
            images.append(decode_image(part))
            return {"type": "image"}
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
    if (path / "preprocessor_config.json").is_file():  # the audio and image processors
        fe = WhisperFeatureExtractor.from_pretrained(str(path), local_files_only=True)
        media = ThinkerMedia(thinker, tokenizer, fe, _image_processor(path), config)
    return CausalLM(model=thinker, tokenizer=tokenizer,
                    eos_token_ids=eos_ids(path, text_config, tokenizer), model_dir=str(path),
                    dtype=torch_dtype, device=dev, random_weights=_is_random(path),
                    config=text_config, cache_kwarg=cache_keyword(thinker.forward),
                    attn_subconfig="text_config",
                    keeps_logits=False,
                    export_layers=[0, int(config.talker_config.accept_hidden_layer)],
                    media=media, rope=TextFirstRope(), deepstack=install_deepstack(thinker))


def _image_processor(path: Path) -> Any:
    """The release's image processor (PIL form), or None when the config has none."""
    import json

    from transformers import Qwen2VLImageProcessorPil

    config = json.loads((path / "preprocessor_config.json").read_text())
    if "patch_size" not in config or "merge_size" not in config:
        return None
    return Qwen2VLImageProcessorPil.from_pretrained(str(path), local_files_only=True)
