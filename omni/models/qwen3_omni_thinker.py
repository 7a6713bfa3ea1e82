"""Qwen3-Omni-MoE's thinker as a text LM for the AR engine (text in, text out).

Quirks (reference/models.md 2a): a release is one combined checkpoint; loading the
thinker alone works through ``Qwen3OmniMoeForConditionalGeneration`` with
``enable_audio_output = False`` (no talker, no code2wav built). The thinker's shapes are
in ``config.thinker_config.text_config``; its forward takes 2-D text position ids (it
expands them to its multimodal rotary layout itself) but not ``logits_to_keep``, so the
engine picks the rows it needs from the full logits. Only the text model gets the
engine's attention; the audio and vision towers keep theirs.
"""

from __future__ import annotations

from pathlib import Path

from omni.engines.base import EngineLoadError
from omni.models.hf_causal import CausalLM, _is_random, _resolve_dtype, eos_ids


def load_thinker(path: Path, dtype: str, device: str) -> CausalLM:
    import torch
    from transformers import AutoConfig, AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

    dev = torch.device(device)
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        config.enable_audio_output = False  # build the thinker only
        text_config = config.thinker_config.text_config
        torch_dtype = _resolve_dtype(dtype, dev, text_config)
        model, info = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
            str(path), config=config, dtype=torch_dtype, local_files_only=True,
            output_loading_info=True)
    except Exception as e:
        raise EngineLoadError(f"model directory {path}: cannot load the Qwen3-Omni thinker: "
                              f"{e}") from e
    missing = sorted(k for k in info.get("missing_keys") or [] if k.startswith("thinker."))
    if missing:
        raise EngineLoadError(f"model directory {path}: thinker weights missing {missing[:8]}; "
                              "refusing to run with randomly initialised weights")
    thinker = model.thinker.to(dev).eval()
    thinker.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return CausalLM(model=thinker, tokenizer=tokenizer,
                    eos_token_ids=eos_ids(path, text_config, tokenizer), model_dir=str(path),
                    dtype=torch_dtype, device=dev, random_weights=_is_random(path),
                    config=text_config, cache_kwarg="cache", attn_subconfig="text_config",
                    keeps_logits=False,
                    export_layers=[0, int(config.talker_config.accept_hidden_layer)])
