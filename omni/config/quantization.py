"""A stage's option ``quantization`` at load time, and the server flag --quantization.

In a pipeline file, ``options: {quantization: fp8}`` on a stage whose engine kind cannot
store its weights in fp8 (omni/engines/kinds.py: only ar and diffusion can) fails the load
naming the stage, as does a value that is no known method: before any engine starts.

The flag applies the method to every stage that can take it and leaves the others as they
are: a Qwen3-Omni server asked for fp8 runs its thinker and talker in fp8 and its vocoder
as it was, which is what a user asking a whole model for fp8 means (vLLM's flag does the
same per layer). Each stage's READY line and card on /v1/models say whether it runs fp8.
A pipeline with no stage that can take the flag fails: the flag would change nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from omni.config.checks import ConfigError
from omni.engines.kinds import KINDS, QUANTIZATIONS, QUANTIZING_KINDS


def check_stage_quantization(src: str, path: str, raw: Mapping[str, Any],
                             options: Mapping[str, Any]) -> None:
    """``options.quantization`` of the stage ``raw`` at ``path`` (an unknown engine kind is
    left to the engine check)."""
    engine = raw.get("engine")
    if "quantization" not in options or not isinstance(engine, str) or engine not in KINDS:
        return
    value = options["quantization"]
    if value not in QUANTIZATIONS:
        raise ConfigError(src, f"{path}.options.quantization",
                          f"unknown method {value!r} on stage '{raw.get('name')}'",
                          f"Use one of {', '.join(QUANTIZATIONS)}")
    if value != "none" and not KINDS[engine].quantizes:
        raise ConfigError(src, f"{path}.options.quantization",
                          f"stage '{raw.get('name')}' is a {engine} stage, which cannot store "
                          f"its weights in {value}",
                          f"Only {' and '.join(QUANTIZING_KINDS)} stages can; remove it there")


def with_quantization(pipeline: Any, method: str) -> Any:
    """``pipeline`` (a PipelineConfig) with ``quantization: method`` on every stage that
    can take it, its views alike; ConfigError if none can (see the module doc)."""
    if method not in QUANTIZATIONS:
        raise ConfigError("command line", "--quantization", f"unknown method {method!r}",
                          f"Use one of {', '.join(QUANTIZATIONS)}")
    if method != "none" and not any(KINDS[s.engine].quantizes for s in pipeline.stages):
        kinds = ", ".join(f"{s.name} ({s.engine})" for s in pipeline.stages)
        raise ConfigError("command line", "--quantization",
                          f"no stage of pipeline '{pipeline.name}' can store its weights in "
                          f"{method} (its stages: {kinds})",
                          f"Only {' and '.join(QUANTIZING_KINDS)} stages can; serve this "
                          "pipeline without --quantization")
    return _quantized(pipeline, method)


def _quantized(pipeline: Any, method: str) -> Any:
    stages = tuple(dataclasses.replace(s, options={**s.options, "quantization": method})
                   if KINDS[s.engine].quantizes else s for s in pipeline.stages)
    views = {name: _quantized(view, method) for name, view in pipeline.views.items()}
    return dataclasses.replace(pipeline, stages=stages, views=views)
