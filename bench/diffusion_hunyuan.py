"""HunyuanImage 2.1 for the diffusion benchmark: the tiny fixture, a local directory, or
the release's shapes with random weights built in memory (no 50 GB checkpoint on disk)."""

from __future__ import annotations

from typing import Any

import torch


def load_hunyuan_image(shape: str, model_dir: str | None, device: str,
                       layers: int = 20) -> tuple[Any, str | None]:
    """(HunyuanImagePipeline on ``device``, its directory or None when built in memory)."""
    from omni.fixtures.tiny_models import ensure_tiny_model
    from omni.models import diffusion as common
    from omni.models.hunyuan_image import _classes

    if model_dir is None and shape == "hunyuan-image-tiny":
        model_dir = str(ensure_tiny_model("hunyuan_image"))
    if model_dir is not None:
        return common.load_pipeline(model_dir, _classes(), device=device, dtype="auto"), model_dir
    return real_size_hunyuan_image(device, layers), None


def real_size_hunyuan_image(device: str, layers: int = 20) -> Any:
    """HunyuanImagePipeline with HunyuanImage 2.1's transformer (20 double + 40 single
    blocks, 28 heads x 128, Qwen 3584 + ByT5 1472 text: ~17 B parameters; ``layers``
    double blocks and twice as many single ones), VAE (32x, 64 channels) and guiders (the
    class defaults: CFG, then APG from step 5), random bf16 weights; text encoders of the
    release's widths (Qwen2.5-VL-7B 3584, ByT5 1472) with 3 and 2 layers and the tiny
    fixture's Qwen tokenizer (prompt encoding is once per request, not what is measured)."""
    from diffusers import (
        AdaptiveProjectedMixGuidance,
        AutoencoderKLHunyuanImage,
        FlowMatchEulerDiscreteScheduler,
        HunyuanImagePipeline,
        HunyuanImageTransformer2DModel,
    )
    from transformers import (
        AutoTokenizer,
        ByT5Tokenizer,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        T5Config,
        T5EncoderModel,
    )

    from omni.fixtures.tiny_hunyuan import HUNYUAN_IMAGE_SCHEDULER
    from omni.fixtures.tiny_models import ensure_tiny_model

    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model("hunyuan_image") / "tokenizer"))
    text_config = {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 3,
                   "num_attention_heads": 28, "num_key_value_heads": 4,
                   "vocab_size": len(tok), "rope_theta": 1e6,
                   "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 32, "num_heads": 2,
              "out_hidden_size": 3584}
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            torch.manual_seed(0)
            pipe = HunyuanImagePipeline(
                transformer=HunyuanImageTransformer2DModel(
                    num_layers=layers, num_single_layers=2 * layers, text_embed_2_dim=1472),
                vae=AutoencoderKLHunyuanImage(
                    in_channels=3, out_channels=3, latent_channels=64,
                    block_out_channels=(128, 256, 512, 512, 1024, 1024), layers_per_block=2,
                    spatial_compression_ratio=32, sample_size=384, scaling_factor=0.75289),
                text_encoder=Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(
                    text_config=text_config, vision_config=vision)),
                tokenizer=tok,
                text_encoder_2=T5EncoderModel(T5Config(
                    vocab_size=384, d_model=1472, d_ff=3584, num_layers=2, num_heads=6,
                    d_kv=64, feed_forward_proj="gated-gelu")),
                tokenizer_2=ByT5Tokenizer(),
                scheduler=FlowMatchEulerDiscreteScheduler(**HUNYUAN_IMAGE_SCHEDULER),
                guider=AdaptiveProjectedMixGuidance(),
                ocr_guider=AdaptiveProjectedMixGuidance())
    finally:
        torch.set_default_dtype(previous)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def transformer_inputs(pipe: Any, height: int, width: int, batch: int,
                       device: str) -> dict[str, Any]:
    """Random inputs of one batched transformer call: the pipeline's text lengths (Qwen
    padded to 1000 tokens, ByT5 to 128; 24 and no glyph tokens real), latents channels
    first."""
    cfg, scale = pipe.transformer.config, pipe.vae_scale_factor
    rows = dict(device=device, dtype=pipe.transformer.dtype)
    mask = torch.zeros(batch, 1000, dtype=torch.long, device=device)
    mask[:, :24] = 1
    return {"hidden_states": torch.randn(batch, cfg.in_channels, height // scale,
                                         width // scale, **rows),
            "timestep": torch.full((batch,), 500.0, **rows),
            "encoder_hidden_states": torch.randn(batch, 1000, cfg.text_embed_dim, **rows),
            "encoder_attention_mask": mask,
            "encoder_hidden_states_2": torch.zeros(batch, 128, cfg.text_embed_2_dim, **rows),
            "encoder_attention_mask_2": torch.zeros(batch, 128, dtype=torch.long,
                                                    device=device),
            "return_dict": False}
