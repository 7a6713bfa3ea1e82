"""What the image-chat tests of Qwen2.5-VL / Qwen3-VL compare with (tests/unit/test_ar_vl.py,
tests/http/test_vl_chat.py): test images and transformers' own ``generate`` on them."""

from __future__ import annotations

import io

import numpy as np
import torch

GREEDY = {"temperature": 0, "max_tokens": 8, "ignore_eos": True}
QUESTION = "What is this?"


def png(width: int, height: int, seed: int) -> bytes:
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def reference(model_dir: str, files: list[bytes], n: int) -> list[int]:
    """transformers' generate on the same pixels: the release's image processor, the
    template's pads grown to each image's merged-patch count, as its processor does."""
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoTokenizer, Qwen2VLImageProcessorPil

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    processor = Qwen2VLImageProcessorPil.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    batch = processor(images=[Image.open(io.BytesIO(f)).convert("RGB") for f in files],
                      return_tensors="pt")
    content = [{"type": "image"}] * len(files) + [{"type": "text", "text": QUESTION}]
    text = tok.apply_chat_template([{"role": "user", "content": content}],
                                   add_generation_prompt=True, tokenize=False)
    head, *rest = text.split("<|image_pad|>")
    merge = processor.merge_size ** 2
    text = head + "".join("<|image_pad|>" * int(g.prod() // merge) + tail
                          for g, tail in zip(batch["image_grid_thw"], rest, strict=True))
    ids = tok(text, return_tensors="pt")["input_ids"]
    out = model.generate(input_ids=ids, pixel_values=batch["pixel_values"],
                         image_grid_thw=batch["image_grid_thw"],
                         mm_token_type_ids=(ids == model.config.image_token_id).int(),
                         max_new_tokens=n, do_sample=False, eos_token_id=None)
    return out[0, ids.shape[1]:].tolist()
