"""Adapter for transformers causal LMs loaded from a local Hugging Face directory.

The directory is what a release ships (config.json, generation_config.json, safetensors
weights, tokenizer files, chat template). Nothing is fetched from a hub. Loading fails
loudly when weights are missing: a model must never run with silently random weights
(fixtures built by `omni.fixtures` say they are random through their marker file; the
stage option load_format dummy asks for them, and READY and the stage's card say so).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from omni.engines.base import EngineLoadError, InputFieldError
from omni.models.causal_lm import (
    CausalLM,
    _is_random,
    _resolve_dtype,
    cache_keyword,
    eos_ids,
    sampling_defaults,
)
from omni.models.dummy_weights import random_model, wants_dummy
from omni.models.tool_calls import with_tools

# vision-language releases served by omni/models/qwen_vl.py (kept here: a name, no import)
VL_MODEL_TYPES = ("qwen2_5_vl", "qwen3_vl")
# the releases load_causal_lm hands to adapters of their own (no load_format dummy there)
OWN_LOADERS = ("qwen3_omni_moe", "qwen2_5_omni", *VL_MODEL_TYPES)


def _check_dir(path: Path, weights: bool = True) -> None:
    if not path.is_dir():
        raise EngineLoadError(f"model directory {path} does not exist or is not a directory")
    if not (path / "config.json").is_file():
        raise EngineLoadError(f"model directory {path} has no config.json")
    if weights:
        _check_weights(path)
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise EngineLoadError(
            f"model directory {path} has no tokenizer (expected tokenizer.json / tokenizer_config.json)")


def _check_weights(path: Path) -> None:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise EngineLoadError(f"model directory {path}: unreadable {index.name}: {e}") from e
        missing = sorted({f for f in weight_map.values() if not (path / f).is_file()})
        if missing:
            raise EngineLoadError(
                f"model directory {path}: weight shards listed in {index.name} are missing: "
                + ", ".join(missing))
    elif not (path / "model.safetensors").is_file():
        raise EngineLoadError(
            f"model directory {path} has no weights (expected model.safetensors or "
            "model.safetensors.index.json with its shards)")


def _model_type(path: Path) -> str | None:
    try:
        return json.loads((path / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None


def load_causal_lm(model_dir: str, *, dtype: str = "auto", device: str = "cpu",
                   load_format: str = "auto") -> CausalLM:
    """Load model + tokenizer from a local HF directory; raise EngineLoadError on problems.

    dtype: "auto" = the checkpoint's dtype on accelerators, float32 on CPU; or
    "float32" / "bfloat16" / "float16". load_format "dummy": random weights drawn on the
    device from config.json (omni/models/dummy_weights.py), plain causal LMs only.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # tqdm bars garble a server log, and tqdm's multiprocessing lock is a semaphore the
    # engine process would leak at exit; the launcher logs loading progress instead
    hf_logging.disable_progress_bar()
    path = Path(model_dir).expanduser().resolve()
    kind = _model_type(path)
    if load_format == "dummy" and kind in OWN_LOADERS:
        raise EngineLoadError(f"load_format dummy: {path} is a {kind} release, which loads "
                              "through its own adapter; dummy weights serve plain causal LMs "
                              "(serve it without load_format dummy)")
    dummy = wants_dummy(load_format, path)
    _check_dir(path, weights=not dummy)
    if kind == "qwen3_omni_moe":  # a composite release: serve its thinker
        from omni.models.qwen3_omni_thinker import load_thinker

        return load_thinker(path, dtype=dtype, device=device)
    if kind == "qwen2_5_omni":  # a composite release: serve its thinker
        from omni.models.qwen2_5_omni_thinker import load_thinker as load_omni25_thinker

        return load_omni25_thinker(path, dtype=dtype, device=device)
    if kind in VL_MODEL_TYPES:  # text + images: its own loader and media
        from omni.models.qwen_vl import load_qwen_vl

        return load_qwen_vl(path, dtype=dtype, device=device)
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise EngineLoadError(f"bad device {device!r}: {e}") from e
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as e:
        raise EngineLoadError(f"model directory {path}: cannot read config.json: {e}") from e
    torch_dtype = _resolve_dtype(dtype, dev, config)
    if dummy:
        model, info = random_model(AutoModelForCausalLM, config, dev, torch_dtype), {}
    else:
        try:
            model, info = AutoModelForCausalLM.from_pretrained(
                str(path), config=config, dtype=torch_dtype, local_files_only=True,
                output_loading_info=True)
        except Exception as e:
            raise EngineLoadError(f"model directory {path}: cannot load the model: {e}") from e
    missing = sorted(info.get("missing_keys") or [])
    mismatched = info.get("mismatched_keys") or []
    if missing or mismatched:
        detail = (f"missing {missing[:8]}" if missing else "") + (
            f" mismatched {list(mismatched)[:8]}" if mismatched else "")
        raise EngineLoadError(
            f"model directory {path}: checkpoint does not cover the model ({detail.strip()}); "
            "refusing to run with randomly initialised weights")
    # build-then-copy is the measured better path (bench/results/load-qwen3-8b.md: the
    # weights stay memory-mapped, peak host RSS 4.6 GiB for a 16 GB model, vs 16 GiB
    # and no faster with device_map on transformers 5.17)
    model.to(dev)
    model.eval()
    model.requires_grad_(False)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as e:
        raise EngineLoadError(f"model directory {path}: cannot load the tokenizer: {e}") from e

    eos = eos_ids(path, config, tokenizer)
    return CausalLM(model=model, tokenizer=tokenizer, eos_token_ids=eos, model_dir=str(path),
                    dtype=torch_dtype, device=dev, random_weights=dummy or _is_random(path),
                    load_format=load_format, config=config,
                    cache_kwarg=cache_keyword(model.forward),
                    sampling_defaults=sampling_defaults(path))


def _content_text(content: Any, where: str) -> str:
    """OpenAI message content: a string, or a list of {"type": "text", "text": ...} parts;
    ``where`` names the message (``messages[2]``) in a refusal, as the API's 400 param."""
    if isinstance(content, str):
        return content
    if isinstance(content, Iterable) and not isinstance(content, bytes | Mapping):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise InputFieldError(f"{where}.content[{j}]", "only text content parts are "
                                      f"supported, got {part!r}")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise InputFieldError(f"{where}.content", "must be a string or a list of text parts, "
                          f"got {content!r}")


def apply_chat_template(tokenizer, messages: list[Mapping[str, Any]],
                        tools: list[Mapping[str, Any]] | None = None) -> list[int]:
    """Token ids of `messages` rendered with the directory's chat template + generation
    prompt; ``tools`` (OpenAI function tools) written in the family's format
    (omni/models/tool_calls.py)."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise InputFieldError("messages", "this model directory has no chat template; send "
                              "a prompt instead")
    if not isinstance(messages, list) or not messages:
        raise InputFieldError("messages", "must be a non-empty list")
    norm = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise InputFieldError(f"messages[{i}]", "must be an object with a string 'role'")
        content = m.get("content")  # None beside an assistant's tool_calls
        norm.append({**m, "content": "" if content is None else
                     _content_text(content, f"messages[{i}]")})
    norm, extra = with_tools(norm, tools, template)
    ids = tokenizer.apply_chat_template(norm, add_generation_prompt=True, tokenize=True,
                                        return_dict=False, **extra)
    if isinstance(ids, Mapping):
        ids = ids["input_ids"]
    return [int(i) for i in ids]

