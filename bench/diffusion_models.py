"""Pipelines for the diffusion benchmark: the tiny fixture, a local directory, or the real
Qwen-Image shapes with random weights built in memory (no 41 GB checkpoint on disk)."""

from __future__ import annotations

from typing import Any

import torch


def load_qwen_image(shape: str, model_dir: str | None, device: str,
                    layers: int = 60) -> tuple[Any, str | None]:
    """(pipeline on ``device``, its directory or None when built in memory)."""
    from omni.fixtures.tiny_models import ensure_tiny_model
    from omni.models import diffusion as common
    from omni.models.qwen_image import _classes

    if model_dir is None and shape == "tiny":
        model_dir = str(ensure_tiny_model("qwen_image"))
    if model_dir is not None:
        return common.load_pipeline(model_dir, _classes(), device=device, dtype="auto"), model_dir
    return real_size_qwen_image(device, layers), None


def real_size_qwen_image(device: str, layers: int = 60) -> Any:
    """QwenImagePipeline with the release's transformer (60 layers, 24 heads x 128,
    joint_attention_dim 3584: 20.4 B parameters) and VAE, random bf16 weights; the text
    encoder is Qwen2.5-VL-7B's width (3584) with 2 of its 28 layers and the tiny fixture's
    tokenizer (prompt encoding is once per request and not what the benchmark measures)."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )
    from transformers import AutoTokenizer, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from omni.fixtures.tiny_diffusion import QWEN_IMAGE_SCHEDULER
    from omni.fixtures.tiny_models import ensure_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(str(ensure_tiny_model("qwen_image") / "tokenizer"))
    text_config = {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 2,
                   "num_attention_heads": 28, "num_key_value_heads": 4,
                   "vocab_size": len(tokenizer), "rope_theta": 1e6,
                   "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 32, "num_heads": 2,
              "out_hidden_size": 3584}
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            torch.manual_seed(0)
            pipe = QwenImagePipeline(
                transformer=QwenImageTransformer2DModel(num_layers=layers),
                vae=AutoencoderKLQwenImage(),
                text_encoder=Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(
                    text_config=text_config, vision_config=vision)),
                tokenizer=tokenizer,
                scheduler=FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER))
    finally:
        torch.set_default_dtype(previous)
    pipe.set_progress_bar_config(disable=True)
    return pipe
