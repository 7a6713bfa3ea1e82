"""Qwen3-Omni's image input: what the release's processor and thinker forward do, per
request, in a form the AR engine's packed steps can use (omni/engines/ar_media.py).

- Images: the release's Qwen2-VL image processor (its PIL form: the default form needs
  torchvision) turns each image into patches and a (t, h, w) grid; the vision tower
  gives one embedding per merged patch (h * w / merge^2 of them, replacing that many
  <|image_pad|> tokens) plus "deepstack" features from some of its layers.
- Rotary positions: the thinker's text model takes (4, batch, tokens) position ids, a
  text row (the cache position) and the three rotary axes, which the model's own
  `get_rope_index` computes for the prompt; after the prompt every axis is the cache
  position + the returned delta.
- Deepstack: transformers adds feature i to the visual tokens' hidden states right after
  decoder layer i. A pre-hook on layer i+1 (or on the final norm) does the same here, so
  the hidden states transformers records (layer outputs) stay as its own forward has them.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import Any

import torch

IMAGE_PARTS = ("image",)  # {"type": "image", "image": {"data": <image file bytes>}}


class TextFirstRope:
    """position_ids of the Qwen3-VL family: the text row, then the rotary axes."""

    axes = 3

    @staticmethod
    def position_ids(text: torch.Tensor, axes: torch.Tensor) -> torch.Tensor:
        return torch.cat((text[None], axes.to(text.device)))[:, None, :]


class Deepstack:
    """Adds per-layer vision features to the visual tokens of a packed forward."""

    def __init__(self, layers: Any, final_norm: Any, count: int) -> None:
        self.pending: tuple[torch.Tensor, list[torch.Tensor]] | None = None
        for i in range(count):  # feature i goes in after layer i: before layer i + 1
            after = layers[i + 1] if i + 1 < len(layers) else final_norm
            after.register_forward_pre_hook(self._hook(i))

    def _hook(self, index: int) -> Any:
        def add(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
            if self.pending is None or not args:
                return None
            mask, features = self.pending
            hidden = args[0].clone()
            rows = mask.to(hidden.device)
            hidden[0, rows] += features[index].to(hidden.device, hidden.dtype)
            return (hidden, *args[1:])
        return add

    @contextlib.contextmanager
    def inject(self, step: tuple[torch.Tensor, list[torch.Tensor]]) -> Iterator[None]:
        self.pending = step
        try:
            yield
        finally:
            self.pending = None


def install_deepstack(thinker: Any) -> Deepstack:
    text_model = getattr(thinker.model, "language_model", thinker.model)
    count = len(thinker.config.vision_config.deepstack_visual_indexes)
    return Deepstack(text_model.layers, text_model.norm, count)


def decode_image(part: dict[str, Any]) -> Any:
    """The PIL image of an API-decoded image part."""
    from PIL import Image, UnidentifiedImageError

    image = part.get("image") or {}
    if not isinstance(image.get("data"), bytes):
        raise ValueError("an image part reached the engine undecoded")
    try:
        with Image.open(io.BytesIO(image["data"])) as im:
            return im.convert("RGB")
    except (UnidentifiedImageError, OSError) as e:
        raise ValueError(f"not an image this server can read ({e})") from None


def encode_images(thinker: Any, processor: Any, images: list[Any]) -> dict[str, Any]:
    """Patches of `images` through the vision tower: grid (n, 3), tokens per image,
    embeddings (tokens, H) and deepstack features (per layer: (tokens, H))."""
    batch = processor(images=images, return_tensors="pt")
    grid = batch["image_grid_thw"]
    dev = thinker.device
    out = thinker.get_image_features(batch["pixel_values"].to(dev, thinker.dtype),
                                     grid.to(dev))
    if isinstance(out, tuple):  # older transformers: (embeddings per image, deepstack)
        embeds, deepstack = out
    else:
        embeds, deepstack = out.pooler_output, out.deepstack_features
    per_layer = [torch.cat(list(f)) if isinstance(f, list | tuple) else f for f in deepstack]
    merge = int(processor.merge_size)
    return {"grid": grid, "tokens": (grid.prod(-1) // merge**2).tolist(),
            "embeds": torch.cat(list(embeds)) if isinstance(embeds, list | tuple) else embeds,
            "deepstack": per_layer}


def rope_index(thinker: Any, ids: list[int], grid: torch.Tensor,
               audio_lengths: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """(3, len(ids)) rotary positions of a prompt with images, and the delta after it."""
    owner = thinker.model if hasattr(thinker.model, "get_rope_index") else thinker
    ids_t = torch.tensor([ids])
    positions, delta = owner.get_rope_index(
        ids_t, image_grid_thw=grid, video_grid_thw=None,
        attention_mask=torch.ones_like(ids_t), use_audio_in_video=False,
        audio_seqlens=audio_lengths)
    return positions[:, 0].long().cpu(), int(delta.reshape(-1)[0])
