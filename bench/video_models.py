"""Pipelines for the video benchmark: a tiny fixture, a local release directory, or a
family's real transformer shapes with random bf16 weights built in memory (no 30-120 GB
checkpoint on disk). Real shapes keep the release's transformer(s) and VAE; the text
encoder has the release's width with 2 layers (it runs once per request, and is not what
the benchmark measures) and the tiny fixture's tokenizer."""

from __future__ import annotations

from typing import Any

import torch

FIXTURES = {"wan22_t2v": "wan22_t2v", "wan22_ti2v": "wan22_ti2v", "ltx_video": "ltx_video",
            "ltx2": "ltx2", "hunyuan_video": "hunyuan_video_t2v"}


def load_video_pipeline(family: str, shape: str, model_dir: str | None, device: str,
                        layers: int | None = None) -> Any:
    """The pipeline on ``device``: from ``model_dir``, the tiny fixture, or real shapes."""
    from omni.fixtures.tiny_models import ensure_tiny_model
    from omni.models import diffusion as common
    from omni.models import hunyuan_video, ltx2, ltx_video, wan

    classes = {"ltx_video": ltx_video, "ltx2": ltx2, "hunyuan_video": hunyuan_video}.get(
        family, wan)._classes()
    if model_dir is None and shape == "tiny":
        model_dir = str(ensure_tiny_model(FIXTURES[family]))
    if model_dir is not None:
        return common.load_pipeline(model_dir, classes, device=device, dtype="auto")
    tokenizer_dir = ensure_tiny_model(FIXTURES[family]) / "tokenizer"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            torch.manual_seed(0)
            pipe = _REAL[family](str(tokenizer_dir), layers)
    finally:
        torch.set_default_dtype(previous)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _text_encoder(tokenizer_dir: str, kind: str) -> tuple[Any, Any]:
    from transformers import AutoTokenizer, T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config, model = (UMT5Config, UMT5EncoderModel) if kind == "umt5" else (T5Config,
                                                                           T5EncoderModel)
    # T5-XXL / UMT5-XXL width (4096), 2 of 24 layers
    return tokenizer, model(config(vocab_size=len(tokenizer), d_model=4096, d_ff=10240,
                                   num_layers=2, num_heads=64, d_kv=64))


def _wan22_a14b(tokenizer_dir: str, layers: int | None) -> Any:
    """Wan2.2-T2V-A14B: two 14 B experts (40 layers, 40 heads x 128), Wan 2.1 VAE."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline
    from diffusers import WanTransformer3DModel as Transformer

    from omni.fixtures.tiny_diffusion import WAN_SCHEDULER

    tokenizer, text_encoder = _text_encoder(tokenizer_dir, "umt5")
    return WanPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, vae=AutoencoderKLWan(),
        transformer=Transformer(num_layers=layers or 40),
        transformer_2=Transformer(num_layers=layers or 40), boundary_ratio=0.875,
        scheduler=UniPCMultistepScheduler(**WAN_SCHEDULER))


def _wan22_ti2v(tokenizer_dir: str, layers: int | None) -> Any:
    """Wan2.2-TI2V-5B: 30 layers, 24 heads x 128, ffn 14336, 48 latent channels; Wan 2.2
    VAE (16x space)."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline
    from diffusers import WanTransformer3DModel as Transformer

    from omni.fixtures.tiny_video import WAN22_TI2V_SCHEDULER

    tokenizer, text_encoder = _text_encoder(tokenizer_dir, "umt5")
    vae = AutoencoderKLWan(
        base_dim=160, decoder_base_dim=256, z_dim=48, in_channels=12, out_channels=12,
        is_residual=True, patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4,
        dim_mult=[1, 2, 4, 4], temperal_downsample=[False, True, True],
        latents_mean=[0.0] * 48, latents_std=[1.0] * 48)
    transformer = Transformer(num_attention_heads=24, attention_head_dim=128, in_channels=48,
                              out_channels=48, ffn_dim=14336, num_layers=layers or 30)
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae,
                       transformer=transformer, transformer_2=None, expand_timesteps=True,
                       scheduler=UniPCMultistepScheduler(**WAN22_TI2V_SCHEDULER))


def _ltx_video(tokenizer_dir: str, layers: int | None) -> Any:
    """LTX-Video 2B: 28 layers, 32 heads x 64; the 0.9.1 VAE (timestep-conditioned)."""
    from diffusers import (
        AutoencoderKLLTXVideo,
        FlowMatchEulerDiscreteScheduler,
        LTXPipeline,
        LTXVideoTransformer3DModel,
    )

    from omni.fixtures.tiny_video import LTX_SCHEDULER

    tokenizer, text_encoder = _text_encoder(tokenizer_dir, "t5")
    vae = AutoencoderKLLTXVideo(
        block_out_channels=(128, 256, 512, 512), decoder_block_out_channels=(128, 256, 512),
        layers_per_block=(4, 3, 3, 3, 4), decoder_layers_per_block=(5, 6, 7, 8),
        spatio_temporal_scaling=(True, True, True, False),
        decoder_spatio_temporal_scaling=(True, True, True),
        decoder_inject_noise=(False, False, False, False), upsample_residual=(True, True, True),
        upsample_factor=(2, 2, 2), timestep_conditioning=True)
    return LTXPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae,
                       transformer=LTXVideoTransformer3DModel(num_layers=layers or 28),
                       scheduler=FlowMatchEulerDiscreteScheduler(**LTX_SCHEDULER))


def _ltx2(tokenizer_dir: str, layers: int | None) -> Any:
    """LTX-2 19B: the joint transformer at diffusers' defaults (48 layers; video 32 heads x
    128, audio 32 x 64) with the 2.3 releases' perturbable attention (so both sides run
    the STG pass), the video VAE, audio VAE and vocoder at their defaults; Gemma-3 12B's
    width (3840) with 2 layers and a tiny vision tower (text runs once per request)."""
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        LTX2Pipeline,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
    from transformers import AutoTokenizer, Gemma3Config, Gemma3ForConditionalGeneration

    from omni.fixtures.tiny_ltx2 import LTX2_SCHEDULER

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    text_encoder = Gemma3ForConditionalGeneration(Gemma3Config(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=3840, intermediate_size=15360,
                         num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=8,
                         head_dim=256),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, image_size=28, patch_size=14),
        mm_tokens_per_image=4))
    return LTX2Pipeline(
        tokenizer=tokenizer, text_encoder=text_encoder,
        connectors=LTX2TextConnectors(text_proj_in_factor=3),  # 2 layers + embeddings
        transformer=LTX2VideoTransformer3DModel(num_layers=layers or 48, perturbed_attn=True),
        # the blocks compress 32x space and 8x time (the ratios derived from the defaults
        # say 64x and 16x: the release config states them)
        vae=AutoencoderKLLTX2Video(spatial_compression_ratio=32, temporal_compression_ratio=8),
        audio_vae=AutoencoderKLLTX2Audio(),
        vocoder=LTX2Vocoder(), scheduler=FlowMatchEulerDiscreteScheduler(**LTX2_SCHEDULER))


def _hunyuan_video15(tokenizer_dir: str, layers: int | None) -> Any:
    """HunyuanVideo 1.5 T2V 480p: 54 layers, 16 heads x 128 (8.3 B), its VAE (16x space,
    4x time, 32 channels) and CFG guider; Qwen2.5-VL-7B's width with 3 layers (the
    pipeline reads the third state from the end) and ByT5's (1472) with 2."""
    from diffusers import (
        AutoencoderKLHunyuanVideo15,
        ClassifierFreeGuidance,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideo15Pipeline,
        HunyuanVideo15Transformer3DModel,
    )
    from transformers import (
        AutoTokenizer,
        ByT5Tokenizer,
        Qwen2_5_VLTextConfig,
        Qwen2_5_VLTextModel,
        T5Config,
        T5EncoderModel,
    )

    from omni.fixtures.tiny_hunyuan import HUNYUAN_VIDEO_SCHEDULER

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    text = Qwen2_5_VLTextConfig(vocab_size=len(tokenizer), hidden_size=3584,
                                intermediate_size=18944, num_hidden_layers=3,
                                num_attention_heads=28, num_key_value_heads=4)
    return HunyuanVideo15Pipeline(
        text_encoder=Qwen2_5_VLTextModel(text), tokenizer=tokenizer,
        transformer=HunyuanVideo15Transformer3DModel(num_layers=layers or 54,
                                                     task_type="t2v"),
        vae=AutoencoderKLHunyuanVideo15(), guider=ClassifierFreeGuidance(guidance_scale=6.0),
        scheduler=FlowMatchEulerDiscreteScheduler(**HUNYUAN_VIDEO_SCHEDULER),
        text_encoder_2=T5EncoderModel(T5Config(vocab_size=384, d_model=1472, d_ff=3584,
                                               num_layers=2, num_heads=6, d_kv=64,
                                               feed_forward_proj="gated-gelu")),
        tokenizer_2=ByT5Tokenizer())


_REAL = {"wan22_t2v": _wan22_a14b, "wan22_ti2v": _wan22_ti2v, "ltx_video": _ltx_video,
         "ltx2": _ltx2, "hunyuan_video": _hunyuan_video15}
