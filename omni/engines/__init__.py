"""Engine kinds. Imports are lazy: an echo process must not pay for importing torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from omni.engines.base import Engine, EngineLoadError, resolve_device

if TYPE_CHECKING:
    from omni.engines.proc.spec import EngineSpec


# engine kind -> (module, builder, the omni/models registry of its adapters)
ADAPTER_ENGINES = {
    "diffusion": ("omni.engines.diffusion.engine", "build_diffusion_engine",
                  "DIFFUSION_DENOISERS"),
    "policy": ("omni.engines.policy.engine", "build_policy_engine", "POLICIES"),
}


def build_engine(spec: EngineSpec) -> Engine:
    """Construct the engine a stage asks for, inside its engine process."""
    if spec.engine == "echo":
        from omni.engines.echo.engine import EchoEngine

        return EchoEngine(spec.stage, spec.options)
    if spec.engine == "ar":
        from omni.config.memory import budget_bytes
        from omni.engines.ar.engine import AREngine

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
    if spec.engine == "vllm":
        from omni.engines.vllm.engine import build_vllm_engine

        return build_vllm_engine(spec)
    if spec.engine == "generation":
        from omni.config.memory import budget_bytes
        from omni.engines.generation.engine import build_generation_engine

        if not spec.model:  # whether a model_dir is needed is the adapter's business
            raise EngineLoadError(f"stage '{spec.stage}': engine 'generation' needs a model "
                                  "adapter name")
        device = resolve_device(spec.device)
        return build_generation_engine(spec.model, spec.model_dir, device, spec.dtype,
                                       spec.options,
                                       budget_bytes(spec.memory, spec.memory_share, device))
    if spec.engine in ADAPTER_ENGINES:
        # engines driving a model adapter named by the stage (omni/models: its registry)
        module, builder, registry = ADAPTER_ENGINES[spec.engine]
        if not spec.model:
            raise EngineLoadError(f"stage '{spec.stage}': engine '{spec.engine}' needs a "
                                  f"model adapter name (omni/models: {registry})")
        build = getattr(importlib.import_module(module), builder)
        return build(spec.model, spec.model_dir, resolve_device(spec.device), spec.dtype,
                     spec.options)
    raise EngineLoadError(
        f"stage '{spec.stage}': engine kind '{spec.engine}' is not available in this build "
        "(available: ar, diffusion, echo, generation, policy, vllm)")
