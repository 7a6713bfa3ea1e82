"""Building a stage's engine. Imports are lazy: an echo process must not pay for importing
torch (each kind's builder is imported by name: omni/engines/kinds.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from omni.engines.base import Engine, EngineLoadError
from omni.engines.kinds import KINDS, available, load_builder

if TYPE_CHECKING:
    from omni.engines.proc.spec import EngineSpec


def build_engine(spec: EngineSpec) -> Engine:
    """Construct the engine a stage asks for, inside its engine process: its kind's
    builder (omni/engines/kinds.py)."""
    kind = KINDS.get(spec.engine)
    if kind is None:
        raise EngineLoadError(
            f"stage '{spec.stage}': engine kind '{spec.engine}' is not available in this "
            f"build (available: {available()})")
    if kind.adapters and not spec.model:
        # whether a model_dir is needed too is the adapter's business
        raise EngineLoadError(f"stage '{spec.stage}': engine '{spec.engine}' needs a "
                              f"model adapter name (omni/models: {kind.adapters})")
    return load_builder(kind)(spec)
