"""Routes: the part of a pipeline's graph one request runs, from its output modalities
and, when it says them, its input modalities (docs/pipeline.md, "routes")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from omni.config.frozen import Picklable, set_field
from omni.config.graph import ancestors


class UnknownModalityError(ValueError):
    """A request asked for an output modality the pipeline does not produce."""


class UnsupportedInputError(ValueError):
    """A request's inputs are of modalities no stage on its route takes."""


@dataclass(frozen=True)
class Route(Picklable):
    """The part of the graph one request runs, for one set of output modalities."""

    modalities: tuple[str, ...]
    stages: tuple[str, ...]
    finals: frozenset[str]
    entries: tuple[str, ...]
    producers: Mapping[str, tuple[str, ...]]
    consumers: Mapping[str, tuple[str, ...]]

    def __post_init__(self) -> None:
        set_field(self, "producers", MappingProxyType(dict(self.producers)))
        set_field(self, "consumers", MappingProxyType(dict(self.consumers)))


def build_route(cfg: Any, modalities: tuple[str, ...],
                inputs: frozenset[str] | None) -> Route:
    finals = frozenset(s for m in modalities for s in cfg.outputs[m])
    on_route = ancestors(cfg.edges, finals)
    while inputs is not None:  # drop entries that take none of the request's inputs
        fed = {e.dst for e in cfg.edges if e.src in on_route}
        idle = {s for s in on_route if s not in fed and not inputs & set(cfg.stage(s).inputs)}
        if not idle:
            break
        on_route -= idle
    if inputs is not None and not finals <= on_route:
        raise UnsupportedInputError(
            f"model '{cfg.name}' cannot make {' and '.join(modalities)} output from "
            f"{' and '.join(sorted(inputs)) or 'no'} input")
    stages = tuple(sorted(on_route, key=cfg._order.__getitem__))
    inner = [e for e in cfg.edges if e.src in on_route and e.dst in on_route]
    producers = {s: _ordered(cfg, (e.src for e in inner if e.dst == s)) for s in stages}
    consumers = {s: _ordered(cfg, (e.dst for e in inner if e.src == s)) for s in stages}
    return Route(
        modalities=modalities,
        stages=stages,
        finals=finals,
        entries=tuple(s for s in stages if not producers[s]),
        producers=producers,
        consumers=consumers,
    )


def _ordered(cfg: Any, names: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(names, key=cfg._order.__getitem__))
