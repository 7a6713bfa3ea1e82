"""The generation engine of a stage's spec: a runner's batched, chunked engine
(engine.py), or a streaming one for a runner with per-request state (streams.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from omni.engines.base import Engine, check_options
from omni.engines.generation.engine import GenerationEngine

if TYPE_CHECKING:
    from omni.engines.proc import EngineSpec


def stage_engine(spec: EngineSpec) -> Engine:
    """The engine of a generation stage (omni/engines/kinds.py), its memory budget on its
    resolved device."""
    from omni.config.memory import budget_bytes
    from omni.engines.base import resolve_device

    device = resolve_device(spec.device)
    return build_generation_engine(
        spec.model, model_dir=spec.model_dir, device=device, dtype=spec.dtype,
        options=spec.options, memory_bytes=budget_bytes(spec.memory, spec.memory_share, device))


def build_generation_engine(model: str, *, model_dir: str | None, device: str, dtype: str,
                            options: Mapping[str, Any],
                            memory_bytes: int | None = None) -> Engine:
    """The generation engine for a stage's `model` (adapters: omni/models/__init__.py)."""
    from omni.models import adapter_options, adapter_streams, build_runner

    if adapter_streams(model):  # per-request recurrent state: generation/streams.py
        from omni.engines.generation.streams import build_streaming_engine
        return build_streaming_engine(model, model_dir=model_dir, device=device, dtype=dtype,
                                      options=options)
    check_options(f"generation engine ({model})", options,
                  GenerationEngine.OPTIONS | adapter_options(model))
    runner = build_runner(model, model_dir=model_dir, device=device, dtype=dtype,
                          options=options)
    return GenerationEngine(runner, options, memory_bytes)
