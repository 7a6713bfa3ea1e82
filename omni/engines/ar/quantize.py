"""An AR stage's option ``quantization``: ``fp8`` stores the decoder layers' linear weights
in float8 e4m3 with per-channel scales (omni/engines/quantization/fp8.py says how and which
layers); the embeddings, the LM head and any vision or audio tower keep the model's dtype."""

from __future__ import annotations

from typing import Any

from omni.engines.ar.paged_attention import paged_layers
from omni.engines.quantization import quantize as quantize_blocks


def quantize(lm: Any, choice: Any) -> dict[str, Any]:
    """Apply the stage's quantization to the loaded model; returns READY's keys for it."""
    return quantize_blocks(lm.model, paged_layers(lm.model), choice, "decoder layers")
