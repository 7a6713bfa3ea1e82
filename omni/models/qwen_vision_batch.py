"""One vision-tower call for the images and videos of several prompts: the Qwen vision
towers (Qwen2.5-VL, Qwen3-VL, Qwen2.5-Omni's thinker) take packed patches with their
(t, h, w) grids and attend within each image / video frame only (cu_seqlens, and for the
windowed towers a window index built grid by grid), so packing several prompts' grids in
one call gives each item the features its own call gives.

The AR engine's prompt encoder hands every media prompt that waits to the model's
``encode_batch`` (omni/engines/ar/encoder.py); `encode_batch` here is its shape for these
models: each prompt is rendered (parts checked, files decoded once per distinct file,
keyed by digest), one tower call runs over the distinct files of all prompts, then each
prompt is built from its files' features. A prompt that fails rendering or building
fails alone. The audio helpers here (`clip_digest`, `padded_mels`, `by_kind`) serve the
omni thinkers, whose audio towers pack clips the same way (each clip's own chunks).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from omni.engines.base import InputFieldError, naming_field
from omni.models.qwen_vl_video import Clip
from omni.models.tool_calls import with_tools

# render(messages, tools, unique) -> a rendered prompt; it adds its decoded files to
# `unique` (digest -> decoded file) and keeps their digests
Render = Callable[[Any, Any, dict[str, Any]], Any]
# tower(decoded files) -> their features, in order
Tower = Callable[[list[Any]], list[Any]]
# build(rendered prompt, digest -> features) -> (ids, embeddings, layout)
Build = Callable[[Any, dict[str, Any]], Any]


def encode_batch(prompts: list[tuple[Any, Any]], render: Render, tower: Tower,
                 build: Build) -> list[Any]:
    """Per (messages, tools) prompt its (ids, embeddings, layout), or the exception it
    raised; one tower call for the distinct files of all of them."""
    rendered: list[Any] = []
    unique: dict[str, Any] = {}
    for messages, tools in prompts:
        try:
            rendered.append(render(messages, tools, unique))
        except (ValueError, TypeError) as e:
            rendered.append(e)
    with torch.inference_mode():
        features = dict(zip(unique, tower(list(unique.values())), strict=True)) \
            if unique else {}
    out = []
    for item in rendered:
        if isinstance(item, Exception):
            out.append(item)
            continue
        try:
            out.append(build(item, features))
        except ValueError as e:
            out.append(e)
    return out


def tower_features(model: Any, image_processor: Any, merge: int,
                   items: list[Any]) -> list[dict[str, Any]]:
    """The vision tower over every image (PIL) and video (Clip) at once (videos are cut
    into the same patches, so one call serves both, as transformers' get_video_features
    runs the image path): per item its grid (3,), its embeddings (tokens, H), its
    deepstack features (per layer (tokens, H); none where the tower has none) and, for a
    video, its Clip."""
    # images first (one processor call), then videos: `order` maps back to items
    order = [i for i, x in enumerate(items) if not isinstance(x, Clip)]
    clips = [i for i, x in enumerate(items) if isinstance(x, Clip)]
    pixels, grids = [], []
    if order:
        batch = image_processor(images=[items[i] for i in order], return_tensors="pt")
        pixels.append(batch["pixel_values"])
        grids.append(batch["image_grid_thw"])
    pixels += [items[i].patches for i in clips]
    grids += [items[i].grid for i in clips]
    order += clips
    grid = torch.cat(grids)
    dev = model.device
    out = model.get_image_features(torch.cat(pixels).to(dev, model.dtype), grid.to(dev),
                                   return_dict=True)
    counts = (grid.prod(-1) // merge**2).tolist()
    embeds = _rows(out.pooler_output).split(counts)
    layers = [_rows(f).split(counts) for f in getattr(out, "deepstack_features", None) or []]
    found: list[dict[str, Any]] = [{}] * len(items)
    for k, i in enumerate(order):
        clip = items[i] if isinstance(items[i], Clip) else None
        found[i] = {"grid": grid[k], "embeds": embeds[k], "clip": clip,
                    "deepstack": [layer[k] for layer in layers]}
    return found


def _rows(features: Any) -> torch.Tensor:
    """The tower's output as one (tokens, H) tensor: transformers 5.24 returns one tensor
    per item, earlier 5.x releases (5.17, on the GPU box) one tensor of all items' rows."""
    return features if isinstance(features, torch.Tensor) else torch.cat(list(features))


class BatchedPromptMedia:
    """A media adapter whose encode is its encode_batch of one prompt."""

    def encode(self, messages: list[dict[str, Any]],
               tools: list[dict[str, Any]] | None = None) -> tuple[list[int], Any, Any]:
        result = self.encode_batch([(messages, tools)])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def encode_batch(self, prompts: list[tuple[Any, Any]]) -> list[Any]:
        raise NotImplementedError


class OmniPromptMedia(BatchedPromptMedia):
    """What the omni thinkers' media adapters share: encode_batch over their own _render,
    _part, _audio and _prompt, the message walk, the tower calls, and the template's ids
    checked against the prompt's parts. Subclasses set thinker, images, tokenizer,
    audio_id, image_id and video_id."""

    thinker: Any
    images: Any  # the image processor
    tokenizer: Any
    audio_id: int
    image_id: int
    video_id: int

    def encode_batch(self, prompts: list[tuple[Any, Any]]) -> list[Any]:
        """(ids, embeddings, layout) per (messages, tools) prompt, or the exception that
        prompt raised (a bad prompt fails alone): one vision tower call for the images and
        videos of all of them, one audio tower call for their clips and heard tracks; a
        file sent twice is decoded and encoded once."""
        return encode_batch(prompts, self._render, self._towers, self._prompt)

    def _render(self, messages: Any, tools: Any, unique: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _part(self, part: Any, media: dict[str, Any], unique: dict[str, Any],
              where: str) -> Any:
        raise NotImplementedError

    def _audio(self, clips: list[Any]) -> list[Any]:
        raise NotImplementedError

    def rendered_messages(self, messages: Any, media: dict[str, Any],
                          unique: dict[str, Any]) -> list[dict[str, Any]]:
        """The messages with each content part rendered by `_part` (its files added to
        `media` as digests into `unique`); a part's error names it (the 400's param)."""
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list")
        rendered = []
        for i, m in enumerate(messages):
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):
                content = [naming_field(f"messages[{i}].content[{j}]", self._part, p, media,
                                        unique, f"messages[{i}].content[{j}]")
                           for j, p in enumerate(content)]
            rendered.append({**m, "content": content})
        return rendered

    def _towers(self, files: list[Any]) -> list[Any]:
        """Images and videos through one vision tower call, audio clips (arrays) through
        one audio tower call."""
        return by_kind(files, self._vision, self._audio)

    def _vision(self, items: list[Any]) -> list[dict[str, Any]]:
        return tower_features(self.thinker, self.images, int(self.images.merge_size), items)

    def _prompt(self, rendered: Any, found: dict[str, Any]) -> Any:
        raise NotImplementedError

    def template_ids(self, rendered: list[dict[str, Any]], tools: Any,
                     media: dict[str, list[Any]]) -> list[int]:
        """The chat template's token ids for the rendered messages, with one placeholder
        per media part (a video that brings its track, heard, has no audio one of its own)."""
        rendered, extra = with_tools(rendered, tools, self.tokenizer.chat_template)
        text = self.tokenizer.apply_chat_template(rendered, add_generation_prompt=True,
                                                  tokenize=False, **extra)
        ids = self.tokenizer(text)["input_ids"]
        heard = media["heard"]
        for token, want, kind in ((self.audio_id, len(media["audio"]) - sum(heard), "audio"),
                                  (self.image_id, len(media["image"]), "image"),
                                  (self.video_id, len(media["video"]), "video")):
            if ids.count(token) != want:
                raise InputFieldError("messages", f"the chat template placed "
                                      f"{ids.count(token)} {kind} placeholders for {want} "
                                      f"{kind} parts")
        if any(heard) and not all(heard):  # get_rope_index reads the flag per prompt
            raise InputFieldError("messages", "use_audio_in_video needs every video to "
                                  "have an audio track")
        return ids


def file_digest(kind: str, data: Any) -> str:
    """The key of a file in a batch (the kind: decoded as one); data unchecked here."""
    raw = data if isinstance(data, bytes) else repr(data).encode()
    return f"{kind}:{hashlib.sha256(raw).hexdigest()}"


def clip_digest(unique: dict[str, Any], pcm: Any) -> str:
    """The digest of an audio clip (float32 PCM bytes), its samples added to the batch's
    files."""
    if not isinstance(pcm, bytes):
        raise ValueError("an audio part or track reached the engine undecoded")
    if not pcm or len(pcm) % 4:  # caught here, it fails its prompt, not the tower call
        raise ValueError(f"an audio clip must be float32 samples, at least one; got "
                         f"{len(pcm)} bytes")
    digest = file_digest("audio", pcm)
    if digest not in unique:
        unique[digest] = np.frombuffer(pcm, dtype=np.float32)
    return digest


def by_kind(files: list[Any], vision: Tower, audio: Tower) -> list[Any]:
    """Features of decoded files: images and videos through `vision` in one call, audio
    clips (arrays) through `audio` in one call."""
    found: list[Any] = [{}] * len(files)
    for kind, run in ((False, vision), (True, audio)):
        picked = [i for i, f in enumerate(files) if isinstance(f, np.ndarray) == kind]
        if picked:
            for i, features in zip(picked, run([files[i] for i in picked]), strict=True):
                found[i] = features
    return found


def padded_mels(feature_extractor: Any, clips: list[np.ndarray]) -> dict[str, torch.Tensor]:
    """Log-mel features and frame mask of `clips` as a Whisper feature extractor gives them
    under the releases' processors, which pad every clip to the 30 s window ("max_length"):
    a clip's last frames then see zeros past its end and it counts ceil(samples / hop)
    frames. Padding to the longest clip + one FFT window gives those same features and
    counts (tested) without computing 30 s of silence per clip, whatever else is in the
    batch."""
    fe = feature_extractor
    longest = max(len(c) for c in clips) + int(fe.n_fft)
    hop = int(fe.hop_length)
    return fe(clips, sampling_rate=fe.sampling_rate, padding="max_length",
              max_length=-(-longest // hop) * hop, truncation=False,
              return_attention_mask=True, return_tensors="pt")
