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


def mp4(seed: int, frames: int = 40, fps: int = 8, width: int = 64,
        height: int = 48) -> bytes:
    """A 5 s H.264 MP4 of random frames (blocks of 8 px, so they survive encoding). The
    tiny fixtures sample 8 of its frames, 1.6 a second: 4 temporal patches 1.25 s apart,
    so a time step left at the default (1 s) would move the rotary positions."""
    from omni.media.video import encode_mp4

    blocks = np.random.default_rng(seed).random((frames, height // 8, width // 8, 3))
    pixels = (blocks * 255).astype("uint8").repeat(8, 1).repeat(8, 2)
    return encode_mp4(pixels, fps)


def video_reference(model_dir: str, video: bytes, n: int, image: bytes | None = None
                    ) -> list[int]:
    """transformers' generate on one video (after one image, if given: the image
    reference's inputs), its inputs made the way the release's
    processors make them, with transformers' own pieces where they run without
    torchvision: its PyAV reader and metadata, Qwen3-VL's sample_frames and smart_resize,
    the processors' patchify and Qwen3-VL's timestamps; frames resized with PIL bicubic."""
    import json
    from pathlib import Path

    from transformers import AutoModelForImageTextToText, AutoTokenizer

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    rules = json.loads((Path(model_dir) / "video_preprocessor_config.json").read_text())
    qwen3 = model.config.model_type == "qwen3_vl"
    pixels, meta = _sampled_frames(video, rules, qwen3)
    patches, grid = _patches(pixels, rules, qwen3)
    content = [{"type": "video"}, {"type": "text", "text": QUESTION}]
    extra = {} if qwen3 else {
        "second_per_grid_ts": torch.tensor([rules["temporal_patch_size"] / meta.sampled_fps])}
    if image is not None:
        content.insert(0, {"type": "image"})
        extra.update(_image_inputs(model_dir, image))
    text = tok.apply_chat_template([{"role": "user", "content": content}],
                                   add_generation_prompt=True, tokenize=False)
    text = text.replace("<|video_pad|>", _placeholder(grid, meta, rules, qwen3))
    if image is not None:
        merge = rules["merge_size"] ** 2
        text = text.replace("<|image_pad|>", "<|image_pad|>" * int(
            extra["image_grid_thw"][0].prod() // merge))
    ids = tok(text, return_tensors="pt")["input_ids"]
    kinds = (ids == model.config.image_token_id).int() + 2 * (
        ids == model.config.video_token_id).int()
    out = model.generate(input_ids=ids, pixel_values_videos=patches, video_grid_thw=grid,
                         mm_token_type_ids=kinds, max_new_tokens=n, do_sample=False,
                         eos_token_id=None, **extra)
    return out[0, ids.shape[1]:].tolist()


def _image_inputs(model_dir: str, image: bytes) -> dict:
    from PIL import Image
    from transformers import Qwen2VLImageProcessorPil

    processor = Qwen2VLImageProcessorPil.from_pretrained(model_dir)
    batch = processor(images=[Image.open(io.BytesIO(image)).convert("RGB")],
                      return_tensors="pt")
    return {"pixel_values": batch["pixel_values"], "image_grid_thw": batch["image_grid_thw"]}


def _sampled_frames(video: bytes, rules: dict, qwen3: bool) -> tuple[np.ndarray, object]:
    import math
    from functools import partial
    from types import SimpleNamespace

    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_utils import read_video_pyav

    limits = SimpleNamespace(fps=rules["fps"], min_frames=rules["min_frames"],
                             max_frames=rules["max_frames"])

    def qwen2_vl_sample(metadata, **_):  # Qwen2VLVideoProcessor.sample_frames, with fps
        tp, total = rules["temporal_patch_size"], metadata.total_num_frames
        most = math.floor(min(rules["max_frames"], total) / tp) * tp
        count = min(max(total / metadata.fps * rules["fps"], rules["min_frames"]), most, total)
        count = math.floor(count / tp) * tp
        return torch.arange(0, total, total / count).int().tolist()

    sample = partial(Qwen3VLVideoProcessor.sample_frames, limits) if qwen3 else qwen2_vl_sample
    frames, meta = read_video_pyav(io.BytesIO(video), sample_indices_fn=sample)
    return frames, meta


def _patches(frames: np.ndarray, rules: dict, qwen3: bool) -> tuple[torch.Tensor, torch.Tensor]:
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import (
        Qwen3VLVideoProcessor,
    )
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import (
        smart_resize as video_resize,
    )

    p, m, tp = rules["patch_size"], rules["merge_size"], rules["temporal_patch_size"]
    lo, hi = rules["size"]["shortest_edge"], rules["size"]["longest_edge"]
    height, width = frames.shape[1:3]
    h, w = video_resize(len(frames), height, width, temporal_factor=tp, factor=p * m,
                        min_pixels=lo, max_pixels=hi) if qwen3 else \
        smart_resize(height, width, factor=p * m, min_pixels=lo, max_pixels=hi)
    resized = np.stack([np.asarray(Image.fromarray(f).resize((w, h), Image.BICUBIC))
                        for f in frames])
    x = torch.from_numpy(resized).permute(0, 3, 1, 2).float() * rules["rescale_factor"]
    x = (x - torch.tensor(rules["image_mean"]).view(1, -1, 1, 1)) / torch.tensor(
        rules["image_std"]).view(1, -1, 1, 1)
    # the video processors' own patchify (the same in Qwen2-VL's and Qwen3-VL's)
    flat, t, gh, gw = Qwen3VLVideoProcessor.patchify(None, x[None], p, m, tp)
    return flat[0], torch.tensor([[t, gh, gw]])


def _placeholder(grid: torch.Tensor, meta: object, rules: dict, qwen3: bool) -> str:
    """What the processor puts for <|video_pad|>: its pads; Qwen3-VL's per temporal
    patch, after the patch's time (Qwen3VLProcessor.replace_video_token)."""
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    t, h, w = grid[0].tolist()
    per_patch = h * w // rules["merge_size"] ** 2
    if not qwen3:
        return "<|video_pad|>" * (t * per_patch)
    times = Qwen3VLProcessor._calculate_timestamps(
        None, list(meta.frames_indices), meta.fps, rules["temporal_patch_size"])
    return "".join(f"<{s:.1f} seconds><|vision_start|>" + "<|video_pad|>" * per_patch
                   + "<|vision_end|>" for s in times)
