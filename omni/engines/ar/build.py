"""The AR engine of a stage's spec: a causal LM (``hf_causal``, the default) or a model
whose next input is built from its last output (feedback.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from omni.config.memory import budget_bytes
from omni.engines.ar.engine import AREngine
from omni.engines.base import EngineLoadError, resolve_device

if TYPE_CHECKING:
    from omni.engines.proc import EngineSpec


def stage_engine(spec: EngineSpec) -> AREngine:
    """The engine of an ar stage (omni/engines/kinds.py), its memory budget on its
    resolved device."""
    device = resolve_device(spec.device)
    memory = budget_bytes(spec.memory, spec.memory_share, device)
    if spec.model not in (None, "", "hf_causal"):  # a model whose inputs its upstream feeds
        from omni.engines.ar.feedback import build_feedback_engine

        return build_feedback_engine(spec.model, spec.model_dir, dtype=spec.dtype,
                                     device=device, options=spec.options,
                                     memory_bytes=memory)
    if not spec.model_dir:
        raise EngineLoadError(f"stage '{spec.stage}': engine 'ar' needs a model_dir")
    return AREngine(spec.model_dir, dtype=spec.dtype, device=device,
                    options=spec.options, memory_bytes=memory)
