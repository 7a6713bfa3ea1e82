"""An AR stage's option ``quantization``: ``fp8`` stores the decoder layers' linear weights
in float8 e4m3 with per-channel scales (omni/engines/ar/fp8.py says how and which layers); the
embeddings, the LM head and any vision or audio tower keep the model's dtype."""

from __future__ import annotations

import logging
from typing import Any

import torch

from omni.engines.ar.fp8 import quantize_layers
from omni.engines.ar.paged_attention import paged_layers
from omni.engines.base import EngineLoadError

log = logging.getLogger("omni.engines.ar.quantize")

CHOICES = ("none", "fp8")


def quantize(lm: Any, choice: Any) -> int:
    """Apply the stage's quantization to the loaded model; returns the weights converted."""
    if choice is None or choice == "none":
        return 0
    if choice not in CHOICES:
        raise EngineLoadError(f"option quantization must be one of {', '.join(CHOICES)}, "
                              f"got {choice!r}")
    before = _weight_bytes(lm.model)
    converted = quantize_layers(paged_layers(lm.model))
    if lm.device.type == "cuda":
        torch.cuda.empty_cache()  # the bf16 weights just let go of
    log.info("fp8 weights: %d linear weights converted, %.2f -> %.2f GiB", converted,
             before / 2**30, _weight_bytes(lm.model) / 2**30)
    return converted


def _weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())
