"""Weight quantization shared by the engine kinds whose stages take the option
``quantization`` (omni/engines/kinds.py marks them: the AR engine's decoder layers, the
diffusion engine's transformer blocks). fp8.py holds the format and its matmul; ``quantize``
applies a stage's choice to the blocks its engine names and says what it did for READY."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from omni.config.quantization import quantization_method
from omni.engines.base import EngineLoadError
from omni.engines.quantization.fp8 import quantize_layers

log = logging.getLogger("omni.engines.quantization")


def checked_choice(choice: Any) -> str | None:
    """The option's value -> 'fp8', or None for none / null / unset; EngineLoadError
    otherwise. The config's check (omni/config/quantization.py), not a second one: a
    pipeline file's value has passed it already, an engine built from options alone has not."""
    try:
        return quantization_method(choice)
    except ValueError as e:
        raise EngineLoadError(f"option quantization {e}") from None


def quantize(model: nn.Module, blocks: list[nn.Module], choice: Any,
             what: str) -> dict[str, Any]:
    """Store the linear weights of ``blocks`` (inside ``model``) as ``choice`` says; returns
    READY's keys: {} when unquantized, else the method and how many weights it converted
    (a stage card that says fp8 with 0 weights tells a user their widths did not fit)."""
    method = checked_choice(choice)
    if method is None:
        return {}
    before = weight_bytes(model)
    converted = quantize_layers(blocks)
    if any(p.is_cuda for p in model.parameters()):
        torch.cuda.empty_cache()  # the full-precision weights just let go of
    if converted:
        log.info("fp8 weights (%s): %d linear weights converted, %s -> %s", what, converted,
                 _size(before), _size(weight_bytes(model)))
    else:  # every width short of a multiple of 16, say: nothing fp8 will run
        log.warning("fp8 weights (%s): no linear weight could be converted (widths must be "
                    "multiples of 16)", what)
    return {"quantization": method, "quantized_weights": converted}


def weight_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.2f} MiB"
