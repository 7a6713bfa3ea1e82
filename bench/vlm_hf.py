"""The reference side of `python -m bench vlm` (hf-generate): the model's own generate()
from transformers with the release's processor, one request after another, greedy, every
request exactly --new-tokens long (min_new_tokens = max_new_tokens). Image chat: the
model class of the family, AutoProcessor from the directory; Whisper:
WhisperForConditionalGeneration with WhisperProcessor. A request's time counts its
preprocessing (image decode and processor, or log-mel features) as ours does.
"""

from __future__ import annotations

import io
import time
from typing import Any

from bench.ar_hf import _record, _TokenTimes
from bench.ar_report import summarize
from bench.common import say
from bench.vlm_sides import LANGUAGE, QUESTION, free, say_row, whisper_summary


def _load(family: str, model_dir: str, device: str) -> Any:
    import torch
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    from omni.fixtures.vl_release import model_class
    from omni.models.causal_lm import _resolve_dtype

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()  # "generation flags not valid": we pass our own
    # the dtype ours picks ("auto": float32 on a CPU, else the config's)
    dtype = _resolve_dtype("auto", torch.device(device), AutoConfig.from_pretrained(model_dir))
    started = time.perf_counter()
    kwargs = {} if device == "cpu" else {"device_map": device}  # straight onto the GPU
    model = model_class(family).from_pretrained(model_dir, dtype=dtype, **kwargs).eval()
    say(f"[vlm] hf-generate: loaded {model_dir} ({dtype}) in "
        f"{time.perf_counter() - started:.1f} s")
    return model


class _ImageOnlyProcessor:
    """What the release's processor does for one image and a text (its __call__, without
    videos): the chat template, <|image_pad|> grown to one token per merged patch, the
    image processor's pixels, mm_token_type_ids. Only where AutoProcessor cannot load:
    transformers builds the Qwen-VL video processors, and so the processor, only with
    torchvision (this CPU venv has none; the GPU box has it)."""

    PAD = "<|image_pad|>"

    def __init__(self, model_dir: str) -> None:
        from transformers import AutoTokenizer, Qwen2VLImageProcessorPil

        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.images = Qwen2VLImageProcessorPil.from_pretrained(model_dir)
        self.pad_id = self.tok.convert_tokens_to_ids(self.PAD)

    def __call__(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        image = messages[0]["content"][0]["image"]
        text = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        pixels = self.images(images=[image], return_tensors="pt")
        count = int(pixels["image_grid_thw"][0].prod()) // self.images.merge_size ** 2
        ids = self.tok(text.replace(self.PAD, self.PAD * count), return_tensors="pt")
        return {**ids, **pixels, "mm_token_type_ids": (ids["input_ids"] == self.pad_id).long()}


def _processor(model_dir: str) -> tuple[Any, str]:
    try:
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(model_dir)
    except ImportError as e:  # no torchvision
        say(f"[vlm] hf-generate: AutoProcessor unavailable ({str(e).strip()[:80]}...): "
            "the image processor and the tokenizer instead")
        return _ImageOnlyProcessor(model_dir), "image processor + tokenizer"

    def prepare(messages: list[dict[str, Any]]) -> Any:
        return processor.apply_chat_template(messages, add_generation_prompt=True,
                                             tokenize=True, return_dict=True,
                                             return_tensors="pt")
    return prepare, type(processor).__name__


def _vl_one(model: Any, prepare: Any, image: bytes, new_tokens: int,
            start: float) -> dict[str, Any]:
    import torch
    from PIL import Image

    with Image.open(io.BytesIO(image)) as im:
        picture = im.convert("RGB")
    messages = [{"role": "user", "content": [{"type": "image", "image": picture},
                                             {"type": "text", "text": QUESTION}]}]
    inputs = {k: v.to(model.device) for k, v in prepare(messages).items()
              if isinstance(v, torch.Tensor)}
    streamer = _TokenTimes()
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, streamer=streamer)
    tokens = int(out.shape[1] - inputs["input_ids"].shape[1])
    return _record(streamer.times, tokens, start, time.perf_counter())


def _levels(work: dict[int, dict[str, list[Any]]], one: Any, summary: Any) -> dict[str, Any]:
    """One warm-up request, then per level its inputs one after another, timed from the
    level's start (queueing included: the reference serves one request at a time)."""
    one(next(iter(work.values()))["warm"][0], time.perf_counter())
    rows = {}
    for n, items in work.items():
        start = time.perf_counter()
        runs = [one(item, start) for item in items["run"]]
        rows[str(n)] = summary(runs, time.perf_counter() - start)
        say_row("hf-generate", n, rows[str(n)])
    return rows


def hf_vl(family: str, model_dir: str, work: dict[int, dict[str, list[Any]]],
          args: Any) -> tuple[dict[str, Any], str]:
    model = _load(family, model_dir, args.device)
    try:
        prepare, processor = _processor(model_dir)
        return _levels(work, lambda image, start, m=model: _vl_one(m, prepare, image,
                                                                   args.new_tokens, start),
                       lambda runs, wall: summarize(runs, wall, args.new_tokens)), processor
    finally:
        del model
        free(args.device)


def _whisper_one(model: Any, processor: Any, samples: Any, new_tokens: int,
                 start: float) -> dict[str, Any]:
    import numpy as np
    import torch

    from omni.models.whisper import SAMPLE_RATE

    feats = processor(samples.astype(np.float32) / 32768.0, sampling_rate=SAMPLE_RATE,
                      return_tensors="pt", return_attention_mask=True)
    with torch.inference_mode():
        out = model.generate(feats["input_features"].to(model.device, model.dtype),
                             attention_mask=feats["attention_mask"].to(model.device),
                             language=LANGUAGE, task="transcribe", max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False)
    # generate() answers the new tokens only (the four start tokens left out), as ours
    return {"done": time.perf_counter() - start, "tokens": int(out.shape[1])}


def hf_whisper(model_dir: str, work: dict[int, dict[str, list[Any]]],
               args: Any) -> tuple[dict[str, Any], str]:
    from transformers import WhisperProcessor

    model = _load("whisper_hf", model_dir, args.device)
    try:
        processor = WhisperProcessor.from_pretrained(model_dir)
        return _levels(work, lambda clip, start, m=model: _whisper_one(m, processor, clip,
                                                                       args.new_tokens, start),
                       lambda runs, wall: whisper_summary(runs, wall, args.clip_seconds,
                                                          args.new_tokens)), "WhisperProcessor"
    finally:
        del model
        free(args.device)
