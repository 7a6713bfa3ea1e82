"""Pipelines for the diffusion benchmark: the tiny fixture, a local directory, or a
release's real shapes with random weights built in memory (no 20-60 GB checkpoint on disk):
Qwen-Image, FLUX.1, FLUX.2 and HunyuanImage 2.1."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# --shape naming each family's tiny fixture -> the fixture's name in omni.fixtures
TINY_FIXTURES = {"tiny": "qwen_image", "flux1-tiny": "flux1", "flux2-tiny": "flux2",
                 "hunyuan-image-tiny": "hunyuan_image"}


def _load_diffusers(family: str, shape: str, model_dir: str | None, device: str,
                    real_size: Callable[[str, int], Any], layers: int) -> tuple[Any, str | None]:
    """(pipeline on ``device``, its directory or None when built in memory): ``model_dir``
    or the tiny fixture loaded through the family's adapter classes, else ``real_size``."""
    import importlib

    from omni.fixtures.tiny_models import ensure_tiny_model
    from omni.models import diffusion as common

    if model_dir is None and shape in TINY_FIXTURES:
        model_dir = str(ensure_tiny_model(TINY_FIXTURES[shape]))
    if model_dir is not None:
        classes = importlib.import_module(f"omni.models.{family}")._classes()
        return common.load_pipeline(model_dir, classes, device=device, dtype="auto"), model_dir
    return real_size(device, layers), None


def _random_bf16(device: str, build: Callable[[], Any]) -> Any:
    """``build()``'s pipeline with its weights drawn (seed 0) in bf16 directly on
    ``device`` (a full-size model would not fit twice)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            torch.manual_seed(0)
            pipe = build()
    finally:
        torch.set_default_dtype(previous)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _qwen25_vl_encoder(vocab: int, layers: int) -> Any:
    """A Qwen2.5-VL-7B-wide text encoder (3584) with ``layers`` layers and a token vision
    tower: what Qwen-Image and HunyuanImage read prompts with."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    text_config = {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": layers,
                   "num_attention_heads": 28, "num_key_value_heads": 4,
                   "vocab_size": vocab, "rope_theta": 1e6,
                   "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 32, "num_heads": 2,
              "out_hidden_size": 3584}
    return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(
        text_config=text_config, vision_config=vision))


# -- Qwen-Image --------------------------------------------------------------------------
def load_qwen_image(shape: str, model_dir: str | None, device: str,
                    layers: int = 60) -> tuple[Any, str | None]:
    return _load_diffusers("qwen_image", shape, model_dir, device, real_size_qwen_image,
                           layers)


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
    from transformers import AutoTokenizer

    from omni.fixtures.tiny_diffusion import QWEN_IMAGE_SCHEDULER
    from omni.fixtures.tiny_models import ensure_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(str(ensure_tiny_model("qwen_image") / "tokenizer"))
    return _random_bf16(device, lambda: QwenImagePipeline(
        transformer=QwenImageTransformer2DModel(num_layers=layers),
        vae=AutoencoderKLQwenImage(),
        text_encoder=_qwen25_vl_encoder(len(tokenizer), 2),
        tokenizer=tokenizer,
        scheduler=FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER)))


# -- FLUX.1 ------------------------------------------------------------------------------
def load_flux1(shape: str, model_dir: str | None, device: str,
               layers: int = 19) -> tuple[Any, str | None]:
    return _load_diffusers("flux", shape, model_dir, device, real_size_flux1, layers)


def real_size_flux1(device: str, layers: int = 19) -> Any:
    """FluxPipeline with FLUX.1-dev's transformer (19 double + 38 single blocks, 24 heads x
    128, guidance-distilled: 11.9 B parameters; ``layers`` double blocks and twice as many
    single ones) and VAE, random bf16 weights; CLIP-L's and T5-XXL's widths with 2 layers
    each and the tiny fixture's tokenizers (prompt encoding is once per request and not
    what the benchmark measures)."""
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        FluxPipeline,
        FluxTransformer2DModel,
    )
    from transformers import (
        CLIPTextConfig,
        CLIPTextModel,
        CLIPTokenizer,
        T5Config,
        T5EncoderModel,
        T5TokenizerFast,
    )

    from omni.fixtures.tiny_flux import FLUX1_SCHEDULER, FLUX1_VAE_FACTORS
    from omni.fixtures.tiny_models import ensure_tiny_model

    tiny = ensure_tiny_model("flux1")
    clip_tok = CLIPTokenizer.from_pretrained(str(tiny / "tokenizer"))
    t5_tok = T5TokenizerFast.from_pretrained(str(tiny / "tokenizer_2"))
    return _random_bf16(device, lambda: FluxPipeline(
        transformer=FluxTransformer2DModel(num_layers=layers, num_single_layers=2 * layers,
                                           guidance_embeds=True),
        vae=AutoencoderKL(
            block_out_channels=(128, 256, 512, 512),
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4, layers_per_block=2,
            latent_channels=16, use_quant_conv=False, use_post_quant_conv=False,
            **FLUX1_VAE_FACTORS),
        text_encoder=CLIPTextModel(CLIPTextConfig(
            vocab_size=len(clip_tok), hidden_size=768, intermediate_size=3072,
            num_hidden_layers=2, num_attention_heads=12, max_position_embeddings=77,
            eos_token_id=clip_tok.eos_token_id)),
        text_encoder_2=T5EncoderModel(T5Config(
            vocab_size=len(t5_tok), d_model=4096, d_ff=10240, num_layers=2,
            num_heads=64, d_kv=64, feed_forward_proj="gated-gelu")),
        tokenizer=clip_tok, tokenizer_2=t5_tok,
        scheduler=FlowMatchEulerDiscreteScheduler(**FLUX1_SCHEDULER)))


# -- FLUX.2 ------------------------------------------------------------------------------
def load_flux2(shape: str, model_dir: str | None, device: str,
               layers: int = 8) -> tuple[Any, str | None]:
    """(Flux2Pipeline on ``device``, its directory or None when built in memory); the
    adapter loads it (its text tokenizer needs the adapter's loader)."""
    from omni.fixtures.tiny_models import ensure_tiny_model
    from omni.models.flux2 import build_flux2

    if model_dir is None and shape in TINY_FIXTURES:
        model_dir = str(ensure_tiny_model(TINY_FIXTURES[shape]))
    if model_dir is not None:
        return build_flux2(model_dir=model_dir, device=device, dtype="auto",
                           options={}).pipe, model_dir
    return real_size_flux2(device, layers), None


def real_size_flux2(device: str, layers: int = 8) -> Any:
    """Flux2Pipeline with FLUX.2-dev's transformer (8 double + 48 single blocks, 48 heads x
    128: 32 B parameters; ``layers`` double blocks and 6x as many single ones) and VAE,
    random bf16 weights; a text encoder of Mistral Small 3.1's width (5120) with the 30
    layers the pipeline reads (hidden states 10, 20, 30) but a narrow MLP, and the tiny
    fixture's tokenizer (prompt encoding is once per request, not what is measured)."""
    from diffusers import (
        AutoencoderKLFlux2,
        FlowMatchEulerDiscreteScheduler,
        Flux2Pipeline,
        Flux2Transformer2DModel,
    )
    from transformers import (
        Mistral3Config,
        Mistral3ForConditionalGeneration,
        MistralConfig,
        PixtralVisionConfig,
    )

    from omni.fixtures.tiny_flux import FLUX2_SCHEDULER
    from omni.fixtures.tiny_models import ensure_tiny_model
    from omni.models.flux2 import load_text_tokenizer

    tok = load_text_tokenizer(str(ensure_tiny_model("flux2") / "tokenizer"))
    text = MistralConfig(vocab_size=len(tok), hidden_size=5120, intermediate_size=1024,
                         num_hidden_layers=30, num_attention_heads=32, num_key_value_heads=8,
                         head_dim=128)
    vision = PixtralVisionConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, head_dim=32)
    return _random_bf16(device, lambda: Flux2Pipeline(
        transformer=Flux2Transformer2DModel(num_layers=layers, num_single_layers=6 * layers),
        vae=AutoencoderKLFlux2(),
        text_encoder=Mistral3ForConditionalGeneration(Mistral3Config(
            text_config=text, vision_config=vision)),
        tokenizer=tok, scheduler=FlowMatchEulerDiscreteScheduler(**FLUX2_SCHEDULER)))


# -- HunyuanImage 2.1 --------------------------------------------------------------------
def load_hunyuan_image(shape: str, model_dir: str | None, device: str,
                       layers: int = 20) -> tuple[Any, str | None]:
    return _load_diffusers("hunyuan_image", shape, model_dir, device,
                           real_size_hunyuan_image, layers)


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
    from transformers import AutoTokenizer, ByT5Tokenizer, T5Config, T5EncoderModel

    from omni.fixtures.tiny_hunyuan import HUNYUAN_IMAGE_SCHEDULER
    from omni.fixtures.tiny_models import ensure_tiny_model

    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model("hunyuan_image") / "tokenizer"))
    return _random_bf16(device, lambda: HunyuanImagePipeline(
        transformer=HunyuanImageTransformer2DModel(
            num_layers=layers, num_single_layers=2 * layers, text_embed_2_dim=1472),
        vae=AutoencoderKLHunyuanImage(
            in_channels=3, out_channels=3, latent_channels=64,
            block_out_channels=(128, 256, 512, 512, 1024, 1024), layers_per_block=2,
            spatial_compression_ratio=32, sample_size=384, scaling_factor=0.75289),
        text_encoder=_qwen25_vl_encoder(len(tok), 3),
        tokenizer=tok,
        text_encoder_2=T5EncoderModel(T5Config(
            vocab_size=384, d_model=1472, d_ff=3584, num_layers=2, num_heads=6,
            d_kv=64, feed_forward_proj="gated-gelu")),
        tokenizer_2=ByT5Tokenizer(),
        scheduler=FlowMatchEulerDiscreteScheduler(**HUNYUAN_IMAGE_SCHEDULER),
        guider=AdaptiveProjectedMixGuidance(),
        ocr_guider=AdaptiveProjectedMixGuidance()))


# -- what the bench needs per family -----------------------------------------------------
# --shape -> (family, loader); a --model directory's family comes from model_index.json
SHAPES = {"tiny": ("qwen_image", load_qwen_image), "qwen-image": ("qwen_image", load_qwen_image),
          "flux1-tiny": ("flux", load_flux1), "flux1-dev": ("flux", load_flux1),
          "flux2-tiny": ("flux2", load_flux2), "flux2-dev": ("flux2", load_flux2),
          "hunyuan-image-tiny": ("hunyuan_image", load_hunyuan_image),
          "hunyuan-image-2.1": ("hunyuan_image", load_hunyuan_image)}
FAMILY_OF_PIPELINE = {"QwenImagePipeline": "qwen_image", "FluxPipeline": "flux",
                      "Flux2Pipeline": "flux2", "HunyuanImagePipeline": "hunyuan_image"}
LOADERS = {"qwen_image": load_qwen_image, "flux": load_flux1, "flux2": load_flux2,
           "hunyuan_image": load_hunyuan_image}


def load(shape: str, model_dir: str | None, device: str,
         layers: int | None) -> tuple[str, Any, str | None]:
    """(family, pipeline, its directory or None) for --shape / --model."""
    if model_dir is not None:
        from omni.models.diffusion import pipeline_class

        family = FAMILY_OF_PIPELINE[pipeline_class(model_dir)]
        return family, LOADERS[family](shape, model_dir, device)[0], model_dir
    family, loader = SHAPES[shape]
    pipe, model_dir = loader(shape, None, device, *([layers] if layers else []))
    return family, pipe, model_dir


def denoiser(family: str, pipe: Any, device: str, options: dict[str, Any]) -> Any:
    """The adapter's denoiser around an already loaded pipeline."""
    if family == "flux":
        from omni.models.flux import FluxDenoiser

        return FluxDenoiser(pipe, device, options)
    if family == "flux2":
        from omni.models.flux2 import Flux2Denoiser

        return Flux2Denoiser(pipe, device, options)
    if family == "hunyuan_image":
        from omni.models.hunyuan_image import HunyuanImageDenoiser

        return HunyuanImageDenoiser(pipe, device, options)
    from omni.models.qwen_image import QwenImageDenoiser

    return QwenImageDenoiser(pipe, device, options)


def transformer_inputs(family: str, pipe: Any, height: int, width: int, batch: int,
                       device: str) -> dict[str, Any]:
    """Random transformer inputs of one batched call at this size (24 text tokens)."""
    if family == "hunyuan_image":
        return _hunyuan_inputs(pipe, height, width, batch, device)
    transformer, scale = pipe.transformer, pipe.vae_scale_factor
    grid = (height // scale // 2, width // scale // 2)
    dtype = transformer.dtype
    cfg = transformer.config
    rows = dict(device=device, dtype=dtype)
    inputs = {"hidden_states": torch.randn(batch, grid[0] * grid[1], cfg.in_channels, **rows),
              "timestep": torch.full((batch,), 0.5, **rows),
              "encoder_hidden_states": torch.randn(batch, 24, cfg.joint_attention_dim, **rows),
              "return_dict": False}
    if family == "flux":
        inputs.update(pooled_projections=torch.randn(batch, cfg.pooled_projection_dim, **rows),
                      guidance=torch.full((batch,), 3.5, device=device) if cfg.guidance_embeds
                      else None, txt_ids=torch.zeros(24, 3, **rows),
                      img_ids=pipe._prepare_latent_image_ids(1, *grid, device, dtype))
    elif family == "flux2":
        latents = torch.zeros(batch, 1, *grid, device=device)
        text = inputs["encoder_hidden_states"]
        inputs.update(guidance=torch.full((batch,), 4.0, device=device),
                      txt_ids=pipe._prepare_text_ids(text).to(device),
                      img_ids=pipe._prepare_latent_ids(latents).to(device))
    else:
        inputs.update(encoder_hidden_states_mask=None, img_shapes=[[(1, *grid)]] * batch)
    return inputs


def _hunyuan_inputs(pipe: Any, height: int, width: int, batch: int,
                    device: str) -> dict[str, Any]:
    """HunyuanImage's: the pipeline's text lengths (Qwen padded to 1000 tokens, ByT5 to
    128; 24 and no glyph tokens real), latents channels first."""
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
