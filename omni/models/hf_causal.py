"""Adapter for transformers causal LMs loaded from a local Hugging Face directory.

The directory is what a release ships (config.json, generation_config.json, safetensors
weights, tokenizer files, chat template). Nothing is fetched from a hub. Loading fails
loudly when weights are missing: a model must never run with silently random weights
(fixtures built by `omni.fixtures` say they are random through their marker file).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omni.engines.base import EngineLoadError
from omni.fixtures.tiny_models import FIXTURE_MARKER  # stdlib-only import; says "random weights"

_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16", "half": "float16"}


@dataclass
class CausalLM:
    """A loaded causal LM: the model (eval, no grad), its tokenizer and stop ids."""

    model: Any
    tokenizer: Any
    eos_token_ids: set[int]
    model_dir: str
    dtype: Any  # torch.dtype
    device: Any  # torch.device
    random_weights: bool = False
    config: Any = field(default=None, repr=False)
    # the forward() keyword for the KV cache: "cache" in newer transformers, else
    # "past_key_values" (5.24 still accepts it, with a deprecation warning)
    cache_kwarg: str = "past_key_values"
    # where an attention implementation is set: the whole model, or one sub-config of a
    # composite model (the thinker's text model, not its audio/vision towers)
    attn_subconfig: str | None = None
    keeps_logits: bool = True  # forward() takes logits_to_keep
    # hidden layers a downstream stage of this model reads (export_hidden_layers: auto)
    export_layers: list[int] | None = None
    # ... of the prompt only: that stage embeds the answer's token ids itself, so decode
    # steps export nothing (no hidden row per token crosses processes)
    export_prompt_only: bool = False
    media: Any = None  # encodes prompts with media parts: wants(messages), encode, info
    # multi-axis rotary positions (omni/engines/ar/media.py): axes, position_ids(text, axes)
    rope: Any = None
    deepstack: Any = None  # adds vision features to early layers: inject((mask, features))

    def use_attention(self, name: str) -> None:
        self.model.set_attn_implementation(
            {self.attn_subconfig: name} if self.attn_subconfig else name)

    def use_experts(self, name: str) -> None:
        """transformers' MoE experts kernel (eager, grouped_mm, batched_mm, ...); the
        EngineLoadError names the valid ones."""
        setter = getattr(self.model, "set_experts_implementation", None)
        if setter is None:
            raise EngineLoadError(f"{self.model_dir}: this model has no choice of experts "
                                  "implementation (option experts_implementation)")
        try:
            setter({self.attn_subconfig: name} if self.attn_subconfig else name)
        except ValueError as e:
            raise EngineLoadError(f"option experts_implementation: {e}") from e

    def new_cache(self):
        """An empty per-request KV cache for this model."""
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def max_positions(self) -> int | None:
        return getattr(self.config, "max_position_embeddings", None)


def _check_dir(path: Path) -> None:
    if not path.is_dir():
        raise EngineLoadError(f"model directory {path} does not exist or is not a directory")
    if not (path / "config.json").is_file():
        raise EngineLoadError(f"model directory {path} has no config.json")
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
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise EngineLoadError(
            f"model directory {path} has no tokenizer (expected tokenizer.json / tokenizer_config.json)")


def _resolve_dtype(dtype: str, device, config):
    import torch

    if dtype == "auto":
        if device.type == "cpu":
            return torch.float32
        name = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        if isinstance(name, torch.dtype):
            return name
        return getattr(torch, _DTYPES.get(str(name), "bfloat16"))
    if dtype not in _DTYPES:
        raise EngineLoadError(
            f"unknown dtype {dtype!r}; use auto, {', '.join(sorted(set(_DTYPES.values())))}")
    return getattr(torch, _DTYPES[dtype])


def _as_ids(value) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value}


def _model_type(path: Path) -> str | None:
    try:
        return json.loads((path / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None


def eos_ids(path: Path, config: Any, tokenizer: Any) -> set[int]:
    """Stop ids from the config, generation_config.json, else the tokenizer."""
    from transformers import GenerationConfig

    eos = _as_ids(getattr(config, "eos_token_id", None))
    if (path / "generation_config.json").is_file():
        try:
            gen = GenerationConfig.from_pretrained(str(path), local_files_only=True)
            eos |= _as_ids(gen.eos_token_id)
        except Exception as e:
            raise EngineLoadError(
                f"model directory {path}: cannot read generation_config.json: {e}") from e
    if not eos and tokenizer.eos_token_id is not None:
        eos = {int(tokenizer.eos_token_id)}
    return eos


def _is_random(path: Path) -> bool:
    try:
        return bool(json.loads((path / FIXTURE_MARKER).read_text()).get("random_weights"))
    except (OSError, ValueError, AttributeError):
        return False


def load_causal_lm(model_dir: str, *, dtype: str = "auto", device: str = "cpu") -> CausalLM:
    """Load model + tokenizer from a local HF directory; raise EngineLoadError on problems.

    dtype: "auto" = the checkpoint's dtype on accelerators, float32 on CPU; or
    "float32" / "bfloat16" / "float16".
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # tqdm bars garble a server log, and tqdm's multiprocessing lock is a semaphore the
    # engine process would leak at exit; the launcher logs loading progress instead
    hf_logging.disable_progress_bar()
    path = Path(model_dir).expanduser().resolve()
    _check_dir(path)
    if _model_type(path) == "qwen3_omni_moe":  # a composite release: serve its thinker
        from omni.models.qwen3_omni_thinker import load_thinker

        return load_thinker(path, dtype=dtype, device=device)
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise EngineLoadError(f"bad device {device!r}: {e}") from e
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as e:
        raise EngineLoadError(f"model directory {path}: cannot read config.json: {e}") from e
    torch_dtype = _resolve_dtype(dtype, dev, config)
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
                    dtype=torch_dtype, device=dev, random_weights=_is_random(path), config=config,
                    cache_kwarg=cache_keyword(model.forward))


def cache_keyword(forward: Any) -> str:
    """The forward() keyword (and output field) of the KV cache: "cache" from transformers
    5.24 on, "past_key_values" before (5.23, setup.cfg's floor; the H200 box's image has
    5.17, below it: GPU runs carry a newer transformers wheel)."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def _content_text(content: Any) -> str:
    """OpenAI message content: a string, or a list of {"type": "text", "text": ...} parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, Iterable) and not isinstance(content, bytes | Mapping):
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise ValueError(f"only text content parts are supported, got {part!r}")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise ValueError(f"message content must be a string or a list of text parts, got {content!r}")


def apply_chat_template(tokenizer, messages: list[Mapping[str, Any]]) -> list[int]:
    """Token ids of `messages` rendered with the directory's chat template + generation prompt."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model directory has no chat template; send a prompt instead")
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    norm = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}] must be an object with a string 'role'")
        norm.append({**m, "content": _content_text(m.get("content", ""))})
    ids = tokenizer.apply_chat_template(norm, add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    if isinstance(ids, Mapping):
        ids = ids["input_ids"]
    return [int(i) for i in ids]
