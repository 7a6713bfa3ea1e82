"""A loaded causal LM, and what every loader of one needs (omni/models/hf_causal.py, the
Qwen3-Omni thinker and talker): the dtype to load in, the stop ids, the sampling defaults
of generation_config.json, whether the weights are a random fixture's, the KV-cache
keyword of forward()."""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omni.engines.base import EngineLoadError
from omni.fixtures.release_files import FIXTURE_MARKER  # stdlib-only import; says "random weights"

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
    load_format: str = "auto"  # dummy: drawn from config.json (dummy_weights.py)
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
    # request defaults from generation_config.json, under the engine's param names
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
    # the stage's option max_model_len: a context shorter than the model's own, so that
    # more sequences of full length fit a KV cache (None: the model's)
    max_model_len: int | None = None

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
        """The longest sequence (prompt + answer) served: the model's, or less."""
        model = getattr(self.config, "max_position_embeddings", None)
        if self.max_model_len is None:
            return model
        return self.max_model_len if model is None else min(model, self.max_model_len)


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


# generation_config.json's sampling fields -> the AR engine's request param names (as vLLM
# reads them; `do_sample` is not read: an OpenAI-style request samples unless its
# temperature is 0, and a model that ships a temperature wants it used)
SAMPLING_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                   "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                   "max_new_tokens": "max_tokens"}


def sampling_defaults(path: Path) -> dict[str, Any]:
    """The sampling fields generation_config.json sets (the raw file: transformers'
    GenerationConfig would fill in its own defaults, top_k 50, as if the model had)."""
    file = path / "generation_config.json"
    if not file.is_file():
        return {}
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise EngineLoadError(f"model directory {path}: cannot read {file.name}: {e}") from e
    if not isinstance(raw, dict):
        raise EngineLoadError(f"model directory {path}: {file.name} is not a JSON object")
    return {ours: raw[theirs] for theirs, ours in SAMPLING_FIELDS.items()
            if raw.get(theirs) is not None}


def _is_random(path: Path) -> bool:
    try:
        return bool(json.loads((path / FIXTURE_MARKER).read_text()).get("random_weights"))
    except (OSError, ValueError, AttributeError):
        return False


def cache_keyword(forward: Any) -> str:
    """The forward() keyword (and output field) of the KV cache: "cache" from transformers
    5.24 on, "past_key_values" before (5.23, setup.cfg's floor; the H200 box's image has
    5.17, below it: GPU runs carry a newer transformers wheel)."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"
