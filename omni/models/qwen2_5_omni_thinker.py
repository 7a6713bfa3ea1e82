"""Qwen2.5-Omni's thinker for the AR engine: text, audio, images and videos in, text out.

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
  A video part is <|vision_bos|><|VIDEO|><|vision_eos|>, the <|VIDEO|> grown to its
  merged patches, or, heard with its track (``use_audio_in_video``), to its patches and
  its track's audio tokens interleaved by time (omni/models/qwen2_5_omni_video.py: how the
  release's processor samples, sizes and lays out a video). The towers' outputs replace
  those tokens' embeddings. The images and videos of every prompt in the engine's encoder
  batch go through the vision tower in one call (a video's patches are cut like an
  image's: get_video_features is the same tower call), their audio clips through the
  audio tower in one call (`encode_batch`, omni/models/qwen_vision_batch.py).
  Audio tokens take consecutive positions (an audio-only prompt keeps 1-D positions);
  with images or videos the prompt gets the model's own 3-axis ``get_rope_index``
  positions (a video's time axis: seconds per grid x position_id_per_seconds).
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

from omni.engines.base import EngineLoadError, PromptLayout, naming_field
from omni.models.causal_lm import CausalLM, _is_random, _resolve_dtype, cache_keyword, eos_ids
from omni.models.qwen2_5_omni_video import decode_video, omni_video_rules, video_with_audio
from omni.models.qwen3_omni_vision import TextFirstRope, decode_image, rope_index
from omni.models.qwen_vision_batch import (
    OmniPromptMedia,
    clip_digest,
    file_digest,
    padded_mels,
)
from omni.models.qwen_vl_video import VideoRules
from omni.models.qwen_vl_video import token_count as video_token_count

MEDIA_PARTS = ("input_audio", "image", "video")
UNDECODED_PARTS = ("image_url", "audio_url", "video_url")


def audio_tokens(mel_frames: torch.Tensor) -> torch.Tensor:
    """The audio tower's output length for clips of `mel_frames` frames (its two stride-2
    stages; the processor's _get_feat_extract_output_lengths)."""
    after_conv = (mel_frames - 1) // 2 + 1
    return (after_conv - 2) // 2 + 1


class Omni25Media(OmniPromptMedia):
    """Builds (ids, embeddings, layout) of a chat prompt holding audio, image and video
    parts."""

    def __init__(self, thinker: Any, tokenizer: Any, feature_extractor: Any,
                 image_processor: Any, video: VideoRules | None) -> None:
        self.thinker, self.tokenizer, self.fe = thinker, tokenizer, feature_extractor
        self.images, self.video = image_processor, video
        cfg = thinker.config
        self.audio_id, self.image_id = int(cfg.audio_token_index), int(cfg.image_token_index)
        self.video_id = int(cfg.video_token_index)
        self.track = {"audio_start": int(cfg.audio_start_token_id), "audio": self.audio_id,
                      "audio_end": int(cfg.audio_end_token_id), "video": self.video_id}
        self.per_second = float(cfg.position_id_per_seconds)
        self.seconds_per_chunk = float(cfg.seconds_per_chunk)
        # no prompt's videos may take more tokens than the context (counted from headers)
        self.max_video_tokens = int(cfg.text_config.max_position_embeddings)

    def info(self) -> dict[str, Any]:
        parts = ["text", "input_audio", "audio_url"] + (
            ["image_url", "video_url"] if self.images else [])
        return {"input_audio_rate": int(self.fe.sampling_rate), "input_parts": parts}

    @staticmethod
    def wants(messages: Any) -> bool:
        return isinstance(messages, list) and any(
            isinstance(part, dict) and part.get("type") in MEDIA_PARTS + UNDECODED_PARTS
            for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list)
            for part in m["content"])

    def _render(self, messages: Any, tools: Any,
                unique: dict[str, Any]) -> tuple[list[int], dict[str, list[Any]]]:
        """The template's ids and the prompt's files as digests into `unique`, in prompt
        order. Audio: every clip, standalone or a video's track (heard[i]: the i-th video
        brings its track, interleaved with its frames by time)."""
        media: dict[str, Any] = {"audio": [], "image": [], "video": [], "heard": [],
                                 "videos": {}}
        rendered = self.rendered_messages(messages, media, unique)
        # every video's size was checked from its headers before any is decoded
        for digest, (where, data) in media.pop("videos").items():
            if digest not in unique:
                unique[digest] = naming_field(where, decode_video, self.video, data)
        ids = self.template_ids(rendered, tools, media)
        return ids, media

    def _prompt(self, rendered: tuple[list[int], dict[str, list[Any]]],
                found: dict[str, Any]) -> tuple[list[int], Any, Any]:
        ids, media = rendered
        audio, images, videos = ([found[d] for d in media[kind]]
                                 for kind in ("audio", "image", "video"))
        with torch.inference_mode():
            expanded = self._expand(ids, media["heard"], audio, images, videos)
            ids_t = torch.tensor(expanded, device=self.thinker.device)
            embeds = self.thinker.get_input_embeddings()(ids_t)
            for token, items in ((self.audio_id, audio), (self.image_id, images),
                                 (self.video_id, videos)):
                if items:
                    embeds[ids_t == token] = torch.cat([x["embeds"] for x in items]).to(
                        embeds.device, embeds.dtype)
            if not images and not videos:
                return expanded, embeds, None
            rope, delta = self._rope(expanded, images, videos, audio, any(media["heard"]))
        return expanded, embeds, PromptLayout(
            rope, delta, exports={"prompt_rope_positions": rope.tolist()})

    def _expand(self, ids: list[int], heard: list[bool], audio: list[dict[str, Any]],
                images: list[dict[str, Any]], videos: list[dict[str, Any]]) -> list[int]:
        """The template's ids with each media placeholder grown to its token count."""
        clips = iter(a["tokens"] for a in audio)
        shots = iter(len(x["embeds"]) for x in images)
        films = iter(zip(videos, heard, strict=True))
        merge = self.video.merge if self.video else 0
        expanded: list[int] = []
        for t in ids:
            if t == self.audio_id:
                expanded += [t] * next(clips)
            elif t == self.image_id:
                expanded += [t] * next(shots)
            elif t == self.video_id:
                video, with_track = next(films)
                expanded += video_with_audio(video["clip"], merge, next(clips), self.track,
                                             self.per_second, self.seconds_per_chunk) \
                    if with_track else [t] * len(video["embeds"])
            else:
                expanded.append(t)
        return expanded

    def _audio(self, clips: list[np.ndarray]) -> list[dict[str, Any]]:
        """The audio tower's embeddings of `clips`: per clip its embeddings, mel frames and
        token count (mels as the release's processor gives them: `padded_mels`); the
        tower packs clips by their lengths, so one call serves several prompts' clips."""
        feats = padded_mels(self.fe, clips)
        mask = feats["attention_mask"]
        dev = self.thinker.device
        out = self.thinker.get_audio_features(
            feats["input_features"].to(dev, self.thinker.dtype), mask.to(dev))
        lengths = mask.sum(-1)
        tokens = audio_tokens(lengths).tolist()
        return [{"embeds": e, "length": int(n), "tokens": int(k)}
                for e, n, k in zip(out.last_hidden_state.split(tokens), lengths, tokens,
                                   strict=True)]

    def _rope(self, ids: list[int], images: list[dict[str, Any]],
              videos: list[dict[str, Any]], audio: list[dict[str, Any]],
              heard: bool) -> tuple[torch.Tensor, float]:
        """(3, len(ids)) positions and the delta after them: the model's get_rope_index
        (qwen3_omni_vision.rope_index) over this prompt's images, then its videos."""
        grids = {"grid": torch.stack([x["grid"] for x in images]).cpu()} if images else None
        films = {"grid": torch.stack([v["grid"] for v in videos]).cpu(),
                 "second_per_grid": torch.tensor([v["clip"].second_per_grid for v in videos])
                 } if videos else None
        lengths = torch.tensor([a["length"] for a in audio]) if audio else None
        return rope_index(self.thinker, ids, grids, films, lengths, heard)

    def _part(self, part: Any, media: dict[str, Any], unique: dict[str, Any],
              where: str) -> Any:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in UNDECODED_PARTS:
            raise ValueError(f"'{kind}' content parts reach this model decoded by the API")
        if kind in ("image", "video"):
            if self.images is None:
                raise ValueError("this model directory has no image processor config")
            if kind == "image":
                data = (part.get("image") or {}).get("data")
                digest = file_digest("image", data)
                if digest not in unique:
                    unique[digest] = decode_image(part)
                media["image"].append(digest)
            else:
                self._video(part, media, unique, where)
            return {"type": kind}
        if kind != "input_audio":
            return part
        pcm = (part.get("input_audio") or {}).get("pcm_f32le")
        media["audio"].append(clip_digest(unique, pcm))
        return {"type": "audio"}

    def _video(self, part: dict[str, Any], media: dict[str, Any], unique: dict[str, Any],
               where: str) -> None:
        """Take a video part, (where, file) for now, after checking from its headers that
        the prompt's videos fit the context; and its track."""
        video = part.get("video") or {}
        if not isinstance(video.get("data"), bytes):
            raise ValueError("a video part reached the engine undecoded")
        counts = media.setdefault("video_tokens", [])
        counts.append(video_token_count(self.video, video["data"]))
        if sum(counts) > self.max_video_tokens:
            raise ValueError(f"the prompt's videos take {sum(counts)} tokens; the model's "
                             f"context holds {self.max_video_tokens}")
        digest = file_digest("video", video["data"])
        media["videos"].setdefault(digest, (where, video["data"]))
        media["video"].append(digest)
        track = video.get("pcm_f32le")
        media["heard"].append(track is not None)
        if track is not None:
            media["audio"].append(clip_digest(unique, track))


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
        images = _image_processor(path)
        media = Omni25Media(thinker, copy.deepcopy(tokenizer), fe, images,
                            omni_video_rules(path) if images is not None else None)
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
