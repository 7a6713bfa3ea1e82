"""Qwen2.5-Omni's thinker for the AR engine: text, audio and images in, text out.

Quirks:
- A release is one combined checkpoint (``thinker.*``, ``talker.*``, ``token2wav.*``).
  The thinker alone loads through ``Qwen2_5OmniForConditionalGeneration`` with
  ``enable_audio_output = False`` (no talker, no token2wav built). That class overrides
  ``from_pretrained`` to also read ``spk_dict.pt`` and breaks on
  ``output_loading_info=True`` (it calls ``load_speakers`` on the returned tuple), so the
  base class's ``from_pretrained`` is called instead: missing weights are then checked.
- Its forward takes no ``logits_to_keep`` (the engine picks rows from the full logits)
  and takes (text row, 3 axes) position ids like Qwen2.5-VL's.
- Media (what the release's processor does): an audio part is
  <|audio_bos|><|AUDIO|><|audio_eos|>, the <|AUDIO|> grown to the audio tower's output
  length ((L-1)//2+1 -> (n-2)//2+1 of the mel frames L); an image part is
  <|vision_bos|><|IMAGE|><|vision_eos|>, the <|IMAGE|> grown to one token per merged patch.
  The towers' outputs replace those tokens' embeddings. Audio tokens take consecutive
  positions (an audio-only prompt keeps 1-D positions); with images the prompt gets the
  model's own 3-axis ``get_rope_index`` positions.
- What the talker reads (omni/models/qwen2_5_omni_talker.py): for every position the
  thinker fed, the embedding (layer 0) and the LAST layer's hidden state; so this stage
  exports both for the prompt AND every decode step (unlike Qwen3-Omni's, which exports
  the prompt only and lets the talker embed answer tokens).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omni.engines.base import EngineLoadError, PromptLayout
from omni.models.causal_lm import CausalLM, _is_random, _resolve_dtype, cache_keyword, eos_ids
from omni.models.qwen3_omni_vision import TextFirstRope, decode_image
from omni.models.tool_calls import with_tools

MEDIA_PARTS = ("input_audio", "image")
UNDECODED_PARTS = ("image_url", "audio_url", "video_url", "video")


def audio_tokens(mel_frames: torch.Tensor) -> torch.Tensor:
    """The audio tower's output length for clips of `mel_frames` frames (its two stride-2
    stages; the processor's _get_feat_extract_output_lengths)."""
    after_conv = (mel_frames - 1) // 2 + 1
    return (after_conv - 2) // 2 + 1


class Omni25Media:
    """Builds (ids, embeddings, layout) of a chat prompt holding audio and image parts."""

    def __init__(self, thinker: Any, tokenizer: Any, feature_extractor: Any,
                 image_processor: Any) -> None:
        self.thinker, self.tokenizer, self.fe = thinker, tokenizer, feature_extractor
        self.images = image_processor
        cfg = thinker.config
        self.audio_id, self.image_id = int(cfg.audio_token_index), int(cfg.image_token_index)

    def info(self) -> dict[str, Any]:
        parts = ["text", "input_audio", "audio_url"] + (["image_url"] if self.images else [])
        return {"input_audio_rate": int(self.fe.sampling_rate), "input_parts": parts}

    @staticmethod
    def wants(messages: Any) -> bool:
        return isinstance(messages, list) and any(
            isinstance(part, dict) and part.get("type") in MEDIA_PARTS + UNDECODED_PARTS
            for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list)
            for part in m["content"])

    def encode(self, messages: list[dict[str, Any]],
               tools: list[dict[str, Any]] | None = None) -> tuple[list[int], Any, Any]:
        media: dict[str, list[Any]] = {"audio": [], "image": []}
        rendered = []
        for m in messages:
            content = m.get("content")
            if isinstance(content, list):
                content = [self._part(p, media) for p in content]
            rendered.append({**m, "content": content})
        rendered, extra = with_tools(rendered, tools, self.tokenizer.chat_template)
        text = self.tokenizer.apply_chat_template(rendered, add_generation_prompt=True,
                                                  tokenize=False, **extra)
        ids = self.tokenizer(text)["input_ids"]
        with torch.inference_mode():
            audio = self._audio(media["audio"]) if media["audio"] else None
            images = self._images(media["image"]) if media["image"] else None
            expanded = self._expand(ids, audio, images)
            ids_t = torch.tensor(expanded, device=self.thinker.device)
            embeds = self.thinker.get_input_embeddings()(ids_t)
            for token, out in ((self.audio_id, audio), (self.image_id, images)):
                if out is not None:
                    embeds[ids_t == token] = out["embeds"].to(embeds.dtype)
            if images is None:
                return expanded, embeds, None
            rope, delta = self._rope(expanded, images["grid"], audio)
        return expanded, embeds, PromptLayout(
            rope, delta, exports={"prompt_rope_positions": rope.tolist()})

    def _expand(self, ids: list[int], audio: Any, images: Any) -> list[int]:
        """The template's ids with each media placeholder grown to its token count."""
        counts = {self.audio_id: iter(audio["tokens"] if audio else []),
                  self.image_id: iter(images["tokens"] if images else [])}
        for token, out, kind in ((self.audio_id, audio, "audio"),
                                 (self.image_id, images, "image")):
            want = len(out["tokens"]) if out else 0
            if ids.count(token) != want:
                raise ValueError(f"the chat template placed {ids.count(token)} {kind} "
                                 f"placeholders for {want} {kind} parts")
        expanded: list[int] = []
        for t in ids:
            expanded += [t] * int(next(counts[t])) if t in counts else [t]
        return expanded

    def _audio(self, clips: list[np.ndarray]) -> dict[str, Any]:
        """The audio tower's embeddings of `clips` and each clip's token count."""
        feats = self.fe(clips, sampling_rate=self.fe.sampling_rate, padding=True,
                        truncation=False, return_attention_mask=True, return_tensors="pt")
        mask = feats["attention_mask"]
        dev = self.thinker.device
        out = self.thinker.get_audio_features(
            feats["input_features"].to(dev, self.thinker.dtype), mask.to(dev))
        lengths = mask.sum(-1)
        return {"embeds": out.last_hidden_state, "lengths": lengths,
                "tokens": audio_tokens(lengths).tolist()}

    def _images(self, images: list[Any]) -> dict[str, Any]:
        batch = self.images(images=images, return_tensors="pt")
        grid = batch["image_grid_thw"]
        dev = self.thinker.device
        out = self.thinker.get_image_features(
            batch["pixel_values"].to(dev, self.thinker.dtype), grid.to(dev), return_dict=True)
        embeds = out.pooler_output
        embeds = torch.cat(list(embeds)) if isinstance(embeds, list | tuple) else embeds
        merge = int(self.images.merge_size)
        return {"embeds": embeds, "grid": grid, "tokens": (grid.prod(-1) // merge**2).tolist()}

    def _rope(self, ids: list[int], grid: torch.Tensor, audio: Any) -> tuple[torch.Tensor, float]:
        """(3, len(ids)) positions and the delta after them: the model's get_rope_index."""
        ids_t = torch.tensor([ids])
        positions, delta = self.thinker.get_rope_index(
            ids_t, image_grid_thw=grid, attention_mask=torch.ones_like(ids_t),
            audio_seqlens=None if audio is None else audio["lengths"])
        return positions[:, 0].float().cpu(), float(delta.reshape(-1)[0])

    def _part(self, part: Any, media: dict[str, list[Any]]) -> Any:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in UNDECODED_PARTS:
            if kind in ("video", "video_url"):
                raise ValueError("this model serves text, audio and image parts (no video yet)")
            raise ValueError(f"'{kind}' content parts reach this model decoded by the API")
        if kind == "image":
            if self.images is None:
                raise ValueError("this model directory has no image processor config")
            media["image"].append(decode_image(part))
            return {"type": "image"}
        if kind != "input_audio":
            return part
        pcm = (part.get("input_audio") or {}).get("pcm_f32le")
        if not isinstance(pcm, bytes):
            raise ValueError("an audio part reached the engine undecoded")
        media["audio"].append(np.frombuffer(pcm, dtype=np.float32))
        return {"type": "audio"}


def load_omni25_composite(path: Path, *, dtype: Any, audio_output: bool) -> Any:
    """Qwen2_5OmniForConditionalGeneration of a release directory, the thinker only
    unless audio_output; transformers' table of the unbuilt stages' keys is silenced."""
    from transformers import AutoConfig, Qwen2_5OmniForConditionalGeneration
    from transformers.utils import logging as hf_logging

    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    config.enable_audio_output = audio_output
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        composite = Qwen2_5OmniForConditionalGeneration
        return super(composite, composite).from_pretrained(
            str(path), config=config, dtype=dtype, local_files_only=True,
            output_loading_info=True)
    finally:
        hf_logging.set_verbosity(level)


def load_thinker(path: Path, *, dtype: str, device: str) -> CausalLM:
    from transformers import AutoConfig, AutoTokenizer, WhisperFeatureExtractor

    dev = torch.device(device)
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        text_config = config.thinker_config.text_config
        torch_dtype = _resolve_dtype(dtype, dev, text_config)
        model, info = load_omni25_composite(path, dtype=torch_dtype, audio_output=False)
    except Exception as e:
        raise EngineLoadError(f"model directory {path}: cannot load the Qwen2.5-Omni "
                              f"thinker: {e}") from e
    missing = sorted(k for k in info.get("missing_keys") or [] if k.startswith("thinker."))
    if missing:
        raise EngineLoadError(f"model directory {path}: thinker weights missing {missing[:8]}; "
                              "refusing to run with randomly initialised weights")
    thinker = model.thinker.to(dev).eval()
    thinker.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    processor_template(path, tokenizer)
    media = None
    if (path / "preprocessor_config.json").is_file():
        fe = WhisperFeatureExtractor.from_pretrained(str(path), local_files_only=True)
        # its own tokenizer: it encodes on a worker thread (omni/engines/ar/encoder.py)
        media = Omni25Media(thinker, copy.deepcopy(tokenizer), fe, _image_processor(path))
    return CausalLM(model=thinker, tokenizer=tokenizer,
                    eos_token_ids=eos_ids(path, text_config, tokenizer), model_dir=str(path),
                    dtype=torch_dtype, device=dev, random_weights=_is_random(path),
                    config=text_config, cache_kwarg=cache_keyword(thinker.forward),
                    attn_subconfig="text_config", keeps_logits=False,
                    # the talker reads the embedding and the last layer of every position
                    export_layers=[0, int(text_config.num_hidden_layers)],
                    media=media, rope=TextFirstRope())


def processor_template(path: Path, tokenizer: Any) -> None:
    """The release's chat template where only its processor has one: Qwen's omni releases
    ship it as chat_template.json (the processor's legacy file), which the tokenizer does
    not read; a template in the tokenizer's own files wins."""
    file = path / "chat_template.json"
    if getattr(tokenizer, "chat_template", None) or not file.is_file():
        return
    try:
        tokenizer.chat_template = json.loads(file.read_text())["chat_template"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise EngineLoadError(f"model directory {path}: unreadable {file.name}: {e}") from e


def _image_processor(path: Path) -> Any:
    """The release's image processor (PIL form), or None when the config has none."""
    from transformers import Qwen2VLImageProcessorPil

    config = json.loads((path / "preprocessor_config.json").read_text())
    if "patch_size" not in config or "merge_size" not in config:
        return None
    return Qwen2VLImageProcessorPil.from_pretrained(str(path), local_files_only=True)
