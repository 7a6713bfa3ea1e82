"""Qwen2.5-VL and Qwen3-VL for the AR engine: text, images and videos in, text out.

A release is one ``*ForConditionalGeneration`` checkpoint: a vision tower, a Qwen text
model and its LM head. Only the text model gets the engine's attention; the tower keeps
transformers' own. What the release's processor does for an image (its PIL image
processor: the default form needs torchvision) is done here: the chat template puts
<|vision_start|><|image_pad|><|vision_end|> where an image part is; the pad grows to one
token per merged patch (grid t*h*w / merge^2) and the tower's output replaces their
embeddings. Positions are the models' 3-axis M-RoPE from their own ``get_rope_index``
(text tokens on the diagonal; an image's tokens share a time and spread over its grid),
passed to the text model as (text row, 3 axes) like ``generate`` does; after the prompt
every axis is the cache position + the returned delta. Qwen3-VL also adds "deepstack"
features of some tower blocks to the image tokens' hidden states after the first decoder
layers (the hooks of omni/models/qwen3_omni_vision.py, shared with Qwen3-Omni).
Videos (omni/models/qwen_vl_video.py: sampled, sized and cut as the release's video
processor does) fill <|video_pad|> the same way, with their own grids and time steps in
``get_rope_index`` (mm_token_type_ids 2; Qwen2.5-VL's second_per_grid_ts, Qwen3-VL's
per-frame grids after the timestamps written into the prompt).

Batching and caching (`encode_batch`): the AR engine's prompt encoder hands every media
prompt that waits into one call, so the vision tower runs once over all their images
and videos (its attention is per image / video frame: cu_seqlens); an image or video
sent more than once (the same bytes) is decoded and encoded once, its tokens used at
every place it appears.

Bounds: a prompt's images are counted in tokens from their headers (the release
processor's own patch count) before any is decoded; images that would take more than the
model's context are refused with the prompt (a 400), so a request of many large images
(a 64 Mpx PNG is a few hundred KB) cannot decode gigabytes or run the tower for nothing.
A video is counted from its headers too (frame count and rate -> the frames its processor
samples, at most max_frames; its size -> patches). An image the processor refuses (aspect
ratio over 200), a video of fewer frames than a temporal patch or one whose frames end
before its header says fails its prompt here too.
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any

import torch

from omni.engines.base import EngineLoadError, InputFieldError, PromptLayout, naming_field
from omni.media.image import image_size
from omni.models.causal_lm import (
    CausalLM,
    _is_random,
    _resolve_dtype,
    cache_keyword,
    eos_ids,
    sampling_defaults,
)
from omni.models.qwen3_omni_vision import TextFirstRope, decode_image, install_deepstack
from omni.models.qwen_vision_batch import BatchedPromptMedia, encode_batch, tower_features
from omni.models.qwen_vl_video import VideoRules, load_rules, video_tokens
from omni.models.qwen_vl_video import decode as decode_video
from omni.models.qwen_vl_video import token_count as video_token_count
from omni.models.tool_calls import with_tools

IMAGE_KINDS = ("image",)  # the API decodes image_url parts into {"type": "image", ...}
VIDEO_KINDS = ("video",)  # and video_url parts into {"type": "video", ...}


class VisionMedia(BatchedPromptMedia):
    """Builds (ids, embeddings, layout) of chat prompts holding image and video parts."""

    def __init__(self, model: Any, tokenizer: Any, image_processor: Any,
                 deepstack: bool, video: VideoRules) -> None:
        self.model, self.tokenizer, self.images = model, tokenizer, image_processor
        config = model.config
        self.image_id, self.video_id = int(config.image_token_id), int(config.video_token_id)
        self.frame_ids = (int(config.vision_start_token_id), int(config.vision_end_token_id))
        self.merge = int(image_processor.merge_size)
        self.deepstack, self.video = deepstack, video
        # the text model's context: no prompt's images and videos may take more tokens
        self.max_image_tokens = int(model.config.text_config.max_position_embeddings)
        self.patches = image_processor.get_number_of_image_patches  # (height, width) -> n

    def info(self) -> dict[str, Any]:
        return {"input_parts": ["text", "image_url", "video_url"]}

    @staticmethod
    def wants(messages: Any) -> bool:
        kinds = IMAGE_KINDS + VIDEO_KINDS + ("image_url", "video_url")
        return isinstance(messages, list) and any(
            isinstance(part, dict) and part.get("type") in kinds
            for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list)
            for part in m["content"])

    def encode_batch(self, prompts: list[tuple[Any, Any]]) -> list[Any]:
        """(ids, embeddings, layout) per (messages, tools) prompt, or the exception that
        prompt raised (a bad prompt fails alone); one tower call for all their images and
        videos (omni/models/qwen_vision_batch.py)."""
        return encode_batch(prompts, self._render, self._tower,
                            lambda item, found: self._prompt(item[0],
                                                             [found[d] for d in item[1]]))

    def _render(self, messages: Any, tools: Any,
                unique: dict[str, Any]) -> tuple[list[int], list[str]]:
        """The template's token ids and each image's / video's digest, in prompt order."""
        if not isinstance(messages, list) or not messages:
            raise InputFieldError("messages", "must be a non-empty list")
        digests: list[str] = []
        # digest -> (kind, file, where its part first is: errors name it), of this prompt
        files: dict[str, tuple[str, bytes, str]] = {}
        chat = []
        for i, m in enumerate(messages):
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):
                content = [self._part(p, files, digests, f"messages[{i}].content[{j}]")
                           for j, p in enumerate(content)]
            chat.append({**m, "content": content})
        self._check_tokens([files[d] for d in digests])
        for digest, (kind, data, where) in files.items():
            if digest not in unique:  # decoded once per batch, after the prompt's checks
                unique[digest] = naming_field(where, decode_image, {"image": {"data": data}}) \
                    if kind == "image" else naming_field(where, decode_video, self.video, data)
        chat, extra = with_tools(chat, tools, self.tokenizer.chat_template)
        text = self.tokenizer.apply_chat_template(chat, add_generation_prompt=True,
                                                  tokenize=False, **extra)
        ids = self.tokenizer(text)["input_ids"]
        for kind, token in (("image", self.image_id), ("video", self.video_id)):
            want = sum(files[d][0] == kind for d in digests)
            if ids.count(token) != want:
                raise InputFieldError("messages", f"the chat template placed "
                                      f"{ids.count(token)} {kind} placeholders for {want} "
                                      f"{kind} parts")
        return ids, digests

    def _part(self, part: Any, files: dict[str, tuple[str, bytes, str]], digests: list[str],
              where: str) -> Any:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("image_url", "video_url"):
            raise InputFieldError(where, f"{kind!r} content parts reach this model decoded by "
                                  "the API (as 'image' / 'video' parts)")
        if kind not in IMAGE_KINDS + VIDEO_KINDS:
            return part
        data = (part.get(kind) or {}).get("data")
        if not isinstance(data, bytes):
            raise InputFieldError(where, f"an {kind} part reached the engine undecoded")
        digest = f"{kind}:{hashlib.sha256(data).hexdigest()}"  # the kind: decoded as one
        files.setdefault(digest, (kind, data, where))
        digests.append(digest)
        return {"type": kind}

    def _check_tokens(self, files: list[tuple[str, bytes, str]]) -> None:
        """ValueError when the images and videos (every place one appears) would take
        more tokens than the context, or one is refused by the processor; reads headers
        only."""
        total = 0
        for kind, data, where in files:
            if kind == "video":
                total += naming_field(where, video_token_count, self.video, data)
                continue
            total += naming_field(where, self._image_tokens, data)
        if total > self.max_image_tokens:
            raise InputFieldError("messages", f"the prompt's {len(files)} images and videos "
                                  f"take {total} tokens; the model's context holds "
                                  f"{self.max_image_tokens}")

    def _image_tokens(self, data: bytes) -> int:
        width, height = image_size(data)
        return self.patches(height, width) // self.merge**2

    def _tower(self, items: list[Any]) -> list[dict[str, Any]]:
        return tower_features(self.model, self.images, self.merge, items)

    def _prompt(self, ids: list[int], shots: list[dict[str, Any]]
                ) -> tuple[list[int], Any, Any]:
        expanded: list[int] = []
        order = iter(shots)
        for t in ids:
            if t == self.image_id:
                expanded += [t] * len(next(order)["embeds"])
            elif t == self.video_id:
                expanded += video_tokens(self.video, next(order)["clip"], t,
                                         *self.frame_ids, self._tokenize)
            else:
                expanded.append(t)
        dev = self.model.device
        with torch.inference_mode():
            ids_t = torch.tensor(expanded, device=dev)
            embeds = self.model.get_input_embeddings()(ids_t)
            if not shots:
                return expanded, embeds, None
            visual = (ids_t == self.image_id) | (ids_t == self.video_id)
            embeds[visual] = torch.cat([s["embeds"] for s in shots]).to(embeds.dtype)
            rope, delta = self._rope(expanded, shots)
        deepstack = None
        if self.deepstack:
            deepstack = [torch.cat([s["deepstack"][layer] for s in shots])
                         for layer in range(len(shots[0]["deepstack"]))]
        return expanded, embeds, PromptLayout(
            rope, delta, visual_mask=visual.cpu() if deepstack else None, deepstack=deepstack)

    def _tokenize(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _rope(self, ids: list[int], shots: list[dict[str, Any]]) -> tuple[torch.Tensor, float]:
        """(3, len(ids)) positions and the delta after them: the model's get_rope_index,
        with each video's seconds per temporal patch as its processor gives them."""
        ids_t = torch.tensor([ids])
        # mm_token_type_ids: 0 text, 1 image, 2 video
        kinds = (ids_t == self.image_id).int() + 2 * (ids_t == self.video_id).int()
        images = [s["grid"] for s in shots if s["clip"] is None]
        videos = [s for s in shots if s["clip"] is not None]
        positions, delta = self.model.model.get_rope_index(
            ids_t, kinds, image_grid_thw=torch.stack(images).cpu() if images else None,
            video_grid_thw=torch.stack([s["grid"] for s in videos]).cpu() if videos else None,
            second_per_grid_ts=torch.tensor([s["clip"].second_per_grid for s in videos])
            if videos else None, attention_mask=torch.ones_like(ids_t))
        return positions[:, 0].float().cpu(), float(delta.reshape(-1)[0])



def _model_class(model_type: str) -> Any:
    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen3VLForConditionalGeneration

    return {"qwen2_5_vl": Qwen2_5_VLForConditionalGeneration,
            "qwen3_vl": Qwen3VLForConditionalGeneration}[model_type]


def load_qwen_vl(path: Path, *, dtype: str, device: str) -> CausalLM:
    """A Qwen2.5-VL / Qwen3-VL release directory as a CausalLM with image input."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        dev = torch.device(device)
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        torch_dtype = _resolve_dtype(dtype, dev, config)
        model, info = _model_class(config.model_type).from_pretrained(
            str(path), config=config, dtype=torch_dtype, local_files_only=True,
            output_loading_info=True)
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as e:
        raise EngineLoadError(f"model directory {path}: cannot load the "
                              f"vision-language model: {e}") from e
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        raise EngineLoadError(f"model directory {path}: weights missing {missing[:8]}; "
                              "refusing to run with randomly initialised weights")
    model.to(dev).eval()
    model.requires_grad_(False)
    qwen3 = config.model_type == "qwen3_vl"
    processor = _image_processor(path)
    # its own tokenizer: it encodes on a worker thread (omni/engines/ar/encoder.py) while
    # the step loop detokenizes, and a fast tokenizer is not safe to share
    media = None if processor is None else VisionMedia(
        model, copy.deepcopy(tokenizer), processor, deepstack=qwen3,
        video=load_rules(path, config.model_type))
    text_config = config.text_config
    return CausalLM(model=model, tokenizer=tokenizer,
                    eos_token_ids=eos_ids(path, text_config, tokenizer), model_dir=str(path),
                    dtype=torch_dtype, device=dev, random_weights=_is_random(path),
                    config=text_config, cache_kwarg=cache_keyword(model.forward),
                    attn_subconfig="text_config", media=media, rope=TextFirstRope(),
                    deepstack=install_deepstack(model) if qwen3 else None,
                    sampling_defaults=sampling_defaults(path))


def _image_processor(path: Path) -> Any:
    """The release's image processor in its PIL form, None without a config for it."""
    if not (path / "preprocessor_config.json").is_file():
        return None
    from transformers import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil.from_pretrained(str(path), local_files_only=True)
