"""Qwen2.5-VL and Qwen3-VL for the AR engine: text and images in, text out.

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

Batching and caching (`encode_batch`): the AR engine's prompt encoder hands every media
prompt that waits into one call, so the vision tower runs once over all their images
(its attention is per image: cu_seqlens); an image sent more than once (the same bytes)
is decoded and encoded once, its tokens used at every place it appears.

Bounds: a prompt's images are counted in tokens from their headers (the release
processor's own patch count) before any is decoded; images that would take more than the
model's context are refused with the prompt (a 400), so a request of many large images
(a 64 Mpx PNG is a few hundred KB) cannot decode gigabytes or run the tower for nothing.
An image the processor refuses (aspect ratio over 200) fails its prompt here too.
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any

import torch

from omni.engines.base import EngineLoadError, PromptLayout
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
from omni.models.tool_calls import with_tools

IMAGE_KINDS = ("image",)  # the API decodes image_url parts into {"type": "image", ...}


class VisionMedia:
    """Builds (ids, embeddings, layout) of chat prompts holding image parts."""

    def __init__(self, model: Any, tokenizer: Any, image_processor: Any,
                 deepstack: bool) -> None:
        self.model, self.tokenizer, self.images = model, tokenizer, image_processor
        self.image_id = int(model.config.image_token_id)
        self.merge = int(image_processor.merge_size)
        self.deepstack = deepstack
        # the text model's context: no prompt's images may take more tokens than this
        self.max_image_tokens = int(model.config.text_config.max_position_embeddings)
        self.patches = image_processor.get_number_of_image_patches  # (height, width) -> n

    def info(self) -> dict[str, Any]:
        return {"input_parts": ["text", "image_url"]}

    @staticmethod
    def wants(messages: Any) -> bool:
        return isinstance(messages, list) and any(
            isinstance(part, dict) and part.get("type") in IMAGE_KINDS + ("image_url",)
            for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list)
            for part in m["content"])

    def encode(self, messages: list[dict[str, Any]],
               tools: list[dict[str, Any]] | None = None) -> tuple[list[int], Any, Any]:
        result = self.encode_batch([(messages, tools)])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def encode_batch(self, prompts: list[tuple[Any, Any]]) -> list[Any]:
        """(ids, embeddings, layout) per (messages, tools) prompt, or the exception that
        prompt raised (a bad prompt fails alone); one tower call for all their images."""
        rendered: list[Any] = []
        unique: dict[str, Any] = {}  # sha256 of the file -> its PIL image
        for messages, tools in prompts:
            try:
                rendered.append(self._render(messages, tools, unique))
            except (ValueError, TypeError) as e:
                rendered.append(e)
        with torch.inference_mode():
            features = self._tower(list(unique.values())) if unique else {}
        keys = list(unique)
        out = []
        for item in rendered:
            if isinstance(item, Exception):
                out.append(item)
                continue
            ids, digests = item
            try:
                out.append(self._prompt(ids, [keys.index(d) for d in digests], features))
            except ValueError as e:
                out.append(e)
        return out

    def _render(self, messages: Any, tools: Any,
                unique: dict[str, Any]) -> tuple[list[int], list[str]]:
        """The template's token ids and each image's digest, in prompt order."""
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list")
        digests: list[str] = []
        files: dict[str, bytes] = {}  # digest -> file, of this prompt
        chat = []
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):
                content = [self._part(p, files, digests) for p in content]
            chat.append({**m, "content": content})
        self._check_tokens([files[d] for d in digests])
        for digest, data in files.items():
            if digest not in unique:  # decoded once per batch, after the prompt's checks
                unique[digest] = decode_image({"image": {"data": data}})
        chat, extra = with_tools(chat, tools, self.tokenizer.chat_template)
        text = self.tokenizer.apply_chat_template(chat, add_generation_prompt=True,
                                                  tokenize=False, **extra)
        ids = self.tokenizer(text)["input_ids"]
        if ids.count(self.image_id) != len(digests):
            raise ValueError(f"the chat template placed {ids.count(self.image_id)} image "
                             f"placeholders for {len(digests)} image parts")
        return ids, digests

    def _part(self, part: Any, files: dict[str, bytes], digests: list[str]) -> Any:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "image_url":
            raise ValueError("'image_url' content parts reach this model decoded by the API "
                             "(as 'image' parts)")
        if kind not in IMAGE_KINDS:
            return part
        data = (part.get("image") or {}).get("data")
        if not isinstance(data, bytes):
            raise ValueError("an image part reached the engine undecoded")
        digest = hashlib.sha256(data).hexdigest()
        files[digest] = data
        digests.append(digest)
        return {"type": "image"}

    def _check_tokens(self, files: list[bytes]) -> None:
        """ValueError when the images (every place one appears) would take more tokens
        than the context, or one is refused by the processor; reads headers only."""
        total = 0
        for data in files:
            width, height = image_size(data)
            total += self.patches(height, width) // self.merge**2
        if total > self.max_image_tokens:
            raise ValueError(f"the prompt's {len(files)} images take {total} tokens; the "
                             f"model's context holds {self.max_image_tokens}")

    def _tower(self, images: list[Any]) -> dict[str, Any]:
        """The vision tower over every image at once: per image its grid (3,), its
        embeddings (tokens, H) and its deepstack features (per layer (tokens, H))."""
        batch = self.images(images=images, return_tensors="pt")
        grid = batch["image_grid_thw"]
        dev = self.model.device
        out = self.model.get_image_features(
            batch["pixel_values"].to(dev, self.model.dtype), grid.to(dev), return_dict=True)
        counts = (grid.prod(-1) // self.merge**2).tolist()
        embeds = torch.cat(list(out.pooler_output)).split(counts)
        layers = [torch.cat(list(f)).split(counts)
                  for f in getattr(out, "deepstack_features", None) or []]
        return {"grid": grid, "embeds": embeds,
                "deepstack": [[layer[i] for layer in layers] for i in range(len(images))]}

    def _prompt(self, ids: list[int], order: list[int],
                features: dict[str, Any]) -> tuple[list[int], Any, Any]:
        expanded: list[int] = []
        shots = iter(order)
        for t in ids:
            expanded += [t] * len(features["embeds"][next(shots)]) if t == self.image_id \
                else [t]
        dev = self.model.device
        with torch.inference_mode():
            ids_t = torch.tensor(expanded, device=dev)
            embeds = self.model.get_input_embeddings()(ids_t)
            if not order:
                return expanded, embeds, None
            visual = ids_t == self.image_id
            embeds[visual] = torch.cat([features["embeds"][i] for i in order]).to(embeds.dtype)
            rope, delta = self._rope(expanded, features["grid"][order])
        deepstack = None
        if self.deepstack:
            deepstack = [torch.cat([features["deepstack"][i][layer] for i in order])
                         for layer in range(len(features["deepstack"][order[0]]))]
        return expanded, embeds, PromptLayout(
            rope, delta, visual_mask=visual.cpu() if deepstack else None, deepstack=deepstack)

    def _rope(self, ids: list[int], grid: torch.Tensor) -> tuple[torch.Tensor, float]:
        """(3, len(ids)) positions and the delta after them: the model's get_rope_index."""
        ids_t = torch.tensor([ids])
        kinds = (ids_t == self.image_id).int()  # mm_token_type_ids: 0 text, 1 image
        positions, delta = self.model.model.get_rope_index(
            ids_t, kinds, image_grid_thw=grid, attention_mask=torch.ones_like(ids_t))
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
        model, copy.deepcopy(tokenizer), processor, deepstack=qwen3)
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
