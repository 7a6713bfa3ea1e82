"""A server flag that sets one stage option on every stage able to take it (--quantization,
--load-format): the stages of every served pipeline and of their views, the others left as
they are; the start fails only when no served stage can take it, since then the flag would
change nothing (config/quantization.py's module doc says why that is what a user means)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from omni.config.checks import ConfigError
from omni.engines.kinds import KINDS, EngineKind


def with_stage_option(pipelines: list[Any], option: str, value: Any,
                      takes: Callable[[EngineKind], bool]) -> list[Any]:
    """Each pipeline (a PipelineConfig) with ``option: value`` on every stage whose engine
    kind ``takes`` it, its views alike."""
    return [_with(p, option, value, takes) for p in pipelines]


def require_a_taker(pipelines: list[Any], flag: str, takes: Callable[[EngineKind], bool],
                    problem: str, kinds: tuple[str, ...]) -> None:
    """ConfigError naming ``flag`` when no stage of any pipeline can take it: ``problem``
    says what none can do, ``kinds`` which engine kinds could."""
    stages = [s for p in pipelines for s in p.stages]
    if any(takes(KINDS[s.engine]) for s in stages):
        return
    names = ", ".join(p.name for p in pipelines)
    listed = ", ".join(f"{s.name} ({s.engine})" for s in stages)
    raise ConfigError("command line", flag,
                      f"no stage of the served pipelines ({names}) can {problem} "
                      f"(their stages: {listed})",
                      f"Only {' and '.join(kinds)} stages can; serve without {flag}")


def stage_kind_setting(raw: Mapping[str, Any], options: Mapping[str, Any],
                       option: str) -> EngineKind | None:
    """The engine kind of the stage ``raw`` where its ``options`` set ``option``, else
    None (nothing to check; an unknown engine kind is left to the engine check)."""
    engine = raw.get("engine")
    if option not in options or not isinstance(engine, str) or engine not in KINDS:
        return None
    return KINDS[engine]


def _with(pipeline: Any, option: str, value: Any, takes: Callable[[EngineKind], bool]) -> Any:
    stages = tuple(dataclasses.replace(s, options={**s.options, option: value})
                   if takes(KINDS[s.engine]) else s for s in pipeline.stages)
    views = {name: _with(view, option, value, takes) for name, view in pipeline.views.items()}
    return dataclasses.replace(pipeline, stages=stages, views=views)
