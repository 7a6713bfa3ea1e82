"""Qwen3-Omni-MoE's thinker for the AR engine: text, audio, images and video in, text out.

Quirks (reference/models.md 2a): a release is one combined checkpoint; loading the
thinker alone works through ``Qwen3OmniMoeForConditionalGeneration`` with
``enable_audio_output = False`` (no talker, no code2wav built). The thinker's shapes are
in ``config.thinker_config.text_config``; its forward takes 2-D text position ids (it
expands them to its multimodal rotary layout itself) but not ``logits_to_keep``, so the
engine picks the rows it needs from the full logits. Only the text model gets the
engine's attention; the audio and vision towers keep theirs.

Media input (`ThinkerMedia`): what the release's processor does (its video processor,
which needs torchvision, re-expressed in omni/models/qwen3_omni_vision.py; a video's
audio track, when the API sends it, interleaves with its frames): each audio part becomes <|audio_start|>, N x <|audio_pad|>,
<|audio_end|> with N from the audio encoder's length rule, each image or video
<|vision_start|>, M x <|image_pad|> / <|video_pad|>, <|vision_end|> with M from its patch
grid, and the towers' outputs replace the pads' embeddings; the prompt then goes to the
engine as embeddings with its real ids (the talker reads them). Audio tokens take consecutive rotary positions like text
(get_rope_index gives them arange too), so an audio-only prompt keeps 1-D positions; a
prompt with images or videos gets the model's 3-axis positions and deepstack features
(a `PromptLayout`, omni/engines/ar/media.py), and exports its positions to the talker.
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Any

import numpy as np

from omni.engines.base import EngineLoadError, PromptLayout
from omni.models.causal_lm import CausalLM, _is_random, _resolve_dtype, cache_keyword, eos_ids
from omni.models.qwen3_omni_vision import (
    IMAGE_PARTS,
    VIDEO_PARTS,
    TextFirstRope,
    decode_image,
    decode_video,
    install_deepstack,
    interleaved_video,
    joint_deepstack,
    rope_index,
    video_audio_tokens,
    video_patches,
)
from omni.models.qwen_vision_batch import (
    OmniPromptMedia,
    clip_digest,
    file_digest,
    padded_mels,
)
from omni.models.qwen_vl_video import Clip

AUDIO_PARTS = ("input_audio",)
UNSUPPORTED_PARTS = ("video_url", "image_url")  # the API turns them into video / image


class ThinkerMedia(OmniPromptMedia):
    """Builds (ids, embeddings, layout) of a chat prompt holding decoded media parts."""

    def __init__(self, thinker: Any, tokenizer: Any, feature_extractor: Any,
                 image_processor: Any, config: Any):
        self.thinker, self.tokenizer, self.fe = thinker, tokenizer, feature_extractor
        self.images = image_processor
        self.audio_id = int(config.thinker_config.audio_token_id)
        self.image_id = int(config.thinker_config.image_token_id)
        self.video_id = int(config.thinker_config.video_token_id)
        self.n_window = int(config.thinker_config.audio_config.n_window)
        self.tokens = video_audio_tokens(config.thinker_config, int(image_processor.merge_size)) \
            if image_processor is not None else None

    def info(self) -> dict[str, Any]:
        parts = ["text", "input_audio", "audio_url"] + (
            ["image_url", "video_url"] if self.images else [])
        return {"input_audio_rate": int(self.fe.sampling_rate), "input_parts": parts}

    @staticmethod
    def wants(messages: Any) -> bool:
        kinds = AUDIO_PARTS + IMAGE_PARTS + VIDEO_PARTS + UNSUPPORTED_PARTS
        return isinstance(messages, list) and any(
            isinstance(part, dict) and part.get("type") in kinds
            for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list)
            for part in m["content"])

    def _render(self, messages: Any, tools: Any,
                unique: dict[str, Any]) -> tuple[list[int], dict[str, list[Any]]]:
        """The template's ids and the prompt's files as digests into `unique`, in prompt
        order. Audio: every clip, standalone or a video's track (heard[i]: the i-th video
        brings its track, interleaved with its frames by time)."""
        media: dict[str, list[Any]] = {"audio": [], "image": [], "video": [], "heard": []}
        rendered = self.rendered_messages(messages, media, unique)
        return self.template_ids(rendered, tools, media), media

    def _prompt(self, rendered: tuple[list[int], dict[str, list[Any]]],
                found: dict[str, Any]) -> tuple[list[int], Any, Any]:
        ids, media = rendered
        audio = joined([found[d] for d in media["audio"]])
        images = joined([found[d] for d in media["image"]])
        videos = joined([found[d] for d in media["video"]])
        import torch

        expanded = self._expand(ids, media["heard"], audio, images, videos)
        with torch.inference_mode():
            ids_t = torch.tensor(expanded, device=self.thinker.device)
            embeds = self.thinker.get_input_embeddings()(ids_t)
            for token, out in ((self.audio_id, audio), (self.image_id, images),
                               (self.video_id, videos)):
                if out:
                    embeds[ids_t == token] = out["embeds"].to(embeds.device, embeds.dtype)
        if not images and not videos:
            return expanded, embeds, None
        rope, delta = rope_index(self.thinker, expanded, images, videos,
                                 audio["lengths"] if audio else None, any(media["heard"]))
        mask, deepstack = joint_deepstack(ids_t, self.image_id, self.video_id, images, videos)
        return expanded, embeds, PromptLayout(
            rope, delta, visual_mask=mask, deepstack=deepstack,
            exports={"prompt_rope_positions": rope.tolist()})

    def _expand(self, ids: list[int], heard: list[bool], audio: Any, images: Any,
                videos: Any) -> list[int]:
        """The template's ids with each media placeholder grown to its token count."""
        clips = iter(audio["tokens"] if audio else [])
        shots = iter(range(len(heard)))
        image_tokens = iter(images["tokens"] if images else [])
        expanded: list[int] = []
        for t in ids:
            if t == self.audio_id:
                expanded += [t] * int(next(clips))
            elif t == self.image_id:
                expanded += [t] * int(next(image_tokens))
            elif t == self.video_id:
                v = next(shots)
                expanded += interleaved_video(self.tokens, videos, v, next(clips)) \
                    if heard[v] else [t] * int(videos["tokens"][v])
            else:
                expanded.append(t)
        return expanded

    def _audio(self, clips: list[np.ndarray]) -> list[dict[str, Any]]:
        """The audio tower's embeddings of `clips`: per clip its embeddings, mel frames and
        token count. The tower cuts each clip into chunks of 2 x n_window frames, pads
        every chunk to the longest chunk of the call and attends within each clip only;
        its convolutions' edges see that padding (conv biases make it non-zero), so a clip
        shorter than one chunk gets its own features only in a call whose longest chunk
        is its own length. Clips are therefore grouped by min(frames, chunk): every clip
        of a chunk or more (speech, as a rule) shares one call, shorter ones join clips of
        their own length (tested against each clip alone)."""
        import torch
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            _get_feat_extract_output_lengths,
        )

        feats = padded_mels(self.fe, clips)
        mask = feats["attention_mask"]
        lengths = mask.sum(-1)
        groups: dict[int, list[int]] = {}
        for i, n in enumerate(lengths.tolist()):
            groups.setdefault(min(n, 2 * self.n_window), []).append(i)
        dev = self.thinker.device
        found: list[dict[str, Any]] = [{}] * len(clips)
        for picked in groups.values():
            tokens = _get_feat_extract_output_lengths(lengths[picked], self.n_window).tolist()
            with torch.inference_mode():
                out = self.thinker.get_audio_features(
                    feats["input_features"][picked].to(dev, self.thinker.dtype),
                    mask[picked].to(dev)).last_hidden_state
            for i, e, k in zip(picked, out.split(tokens), tokens, strict=True):
                found[i] = {"embeds": e, "length": lengths[i], "tokens": int(k)}
        return found

    def _part(self, part: Any, media: dict[str, list[Any]], unique: dict[str, Any],
              where: str) -> Any:  # where: unused, each file is decoded where it is met
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in UNSUPPORTED_PARTS:
            raise ValueError(f"'{kind}' content parts reach this model decoded by the API "
                             "(as 'image' / 'video' parts)")
        if kind in IMAGE_PARTS + VIDEO_PARTS:
            if self.images is None:
                raise ValueError("this model directory has no image processor config")
            data = (part.get(kind) or {}).get("data")
            digest = file_digest(kind, data)
            if digest not in unique:
                unique[digest] = decode_image(part) if kind == "image" else self._clip(part)
            media[kind].append(digest)
            if kind == "video":
                track = (part.get("video") or {}).get("pcm_f32le")
                media["heard"].append(track is not None)
                if track is not None:
                    media["audio"].append(clip_digest(unique, track))
            return {"type": kind}
        if kind != "input_audio":
            return part
        pcm = (part.get("input_audio") or {}).get("pcm_f32le")
        media["audio"].append(clip_digest(unique, pcm))
        return {"type": "audio"}

    def _clip(self, part: dict[str, Any]) -> Clip:
        """A video part decoded and cut into the vision tower's patches."""
        frames, rate = decode_video(part, self.images)
        patches, grid = video_patches(self.images, frames)
        tp = int(self.images.temporal_patch_size)
        return Clip(patches=patches, grid=grid, second_per_grid=tp / rate, times=[])


def joined(items: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A prompt's items of one kind (per-file features, in prompt order) as the layout
    helpers take them: grids (n, 3), tokens per item, embeddings and deepstack layers
    concatenated, mel lengths of clips, seconds per grid of videos; None for none."""
    import torch

    if not items:
        return None
    out: dict[str, Any] = {"tokens": [len(x["embeds"]) if "grid" in x else x["tokens"]
                                      for x in items],
                           "embeds": torch.cat([x["embeds"] for x in items])}
    if "length" in items[0]:  # audio clips
        out["lengths"] = torch.stack([torch.as_tensor(x["length"]) for x in items])
        return out
    out["grid"] = torch.stack([x["grid"] for x in items]).cpu()
    out["deepstack"] = [torch.cat(layer) for layer in
                       zip(*(x["deepstack"] for x in items), strict=True)]
    if items[0]["clip"] is not None:
        out["second_per_grid"] = torch.tensor([x["clip"].second_per_grid for x in items])
    return out


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


def load_thinker(path: Path, *, dtype: str, device: str) -> CausalLM:
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
        # its own tokenizer: it encodes on a worker thread (omni/engines/ar/encoder.py)
        # while the step loop detokenizes, and a fast tokenizer is not safe to share
        media = ThinkerMedia(thinker, copy.deepcopy(tokenizer), fe, _image_processor(path),
                             config)
    return CausalLM(model=thinker, tokenizer=tokenizer,
                    eos_token_ids=eos_ids(path, text_config, tokenizer), model_dir=str(path),
                    dtype=torch_dtype, device=dev, random_weights=_is_random(path),
                    config=text_config, cache_kwarg=cache_keyword(thinker.forward),
                    attn_subconfig="text_config",
                    keeps_logits=False,
                    export_layers=[0, int(config.talker_config.accept_hidden_layer)],
                    export_prompt_only=True,  # the talker embeds the answer tokens itself
                    media=media, rope=TextFirstRope(), deepstack=install_deepstack(thinker))


def _image_processor(path: Path) -> Any:
    """The release's image processor (PIL form), or None when the config has none."""
    import json

    from transformers import Qwen2VLImageProcessorPil

    config = json.loads((path / "preprocessor_config.json").read_text())
    if "patch_size" not in config or "merge_size" not in config:
        return None
    return Qwen2VLImageProcessorPil.from_pretrained(str(path), local_files_only=True)
