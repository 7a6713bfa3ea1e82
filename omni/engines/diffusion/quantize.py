"""A diffusion stage's option ``quantization``: ``fp8`` stores the denoising transformer's
block weights in float8 e4m3 with per-output-channel scales, through the same fp8_linear as
an AR stage's (omni/engines/quantization/fp8.py says how and which layers).

Which modules: the denoiser's transformers (``transformers()`` if the adapter defines it,
else its diffusers pipeline's components named ``transformer*``: a two-expert model has
two) and in each the blocks of the ModuleLists directly under it (``transformer_blocks``,
``single_transformer_blocks``, ``blocks``): where a DiT's compute is. The patch / text /
timestep embedders, the final norm and output projection, and nested lists such as a text
refiner's stay in the model's dtype, as FP8 releases of these models keep them."""

from __future__ import annotations

from typing import Any

from torch import nn

from omni.engines.base import EngineLoadError
from omni.engines.quantization import checked_choice, quantize


def quantize_denoiser(denoiser: Any, choice: Any) -> dict[str, Any]:
    """Apply the stage's quantization to the denoiser's transformer blocks; READY's keys."""
    method = checked_choice(choice)
    if method is None:
        return {}
    transformers = denoising_transformers(denoiser)
    if not transformers:
        raise EngineLoadError(f"option quantization {method}: this denoiser exposes no "
                              "transformer to store in fp8")
    converted = 0
    for name, transformer in transformers:
        blocks = transformer_blocks(transformer)
        if not blocks:
            raise EngineLoadError(f"option quantization {method}: the transformer '{name}' "
                                  "has no block list to store in fp8")
        done = quantize(transformer, blocks, method, f"{name}, {len(blocks)} blocks")
        converted += done["quantized_weights"]
    return {"quantization": method, "quantized_weights": converted}


def denoising_transformers(denoiser: Any) -> list[tuple[str, nn.Module]]:
    """(name, module) of each transformer the denoiser runs."""
    own = getattr(denoiser, "transformers", None)
    if callable(own):
        return list(own())
    components = getattr(getattr(denoiser, "pipe", None), "components", None) or {}
    return [(name, module) for name, module in components.items()
            if name.startswith("transformer") and isinstance(module, nn.Module)]


def transformer_blocks(transformer: nn.Module) -> list[nn.Module]:
    """The blocks of the ModuleLists directly under the transformer, in order."""
    return [block for child in transformer.children() if isinstance(child, nn.ModuleList)
            for block in child]
