"""The pipeline as a graph: stage order, cycles, the stages an output needs, and the
``outputs`` / ``default_modalities`` sections checked against the stages; every failure
is a ConfigError."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from omni.config.checks import ConfigError, as_list, as_mapping, did_you_mean

if TYPE_CHECKING:  # only the annotations need these
    from omni.config.stages import EdgeConfig, StageConfig

    Stages = tuple[StageConfig, ...]
    Edges = tuple[EdgeConfig, ...]
    Outputs = Mapping[str, tuple[str, ...]]

def successors(edges: Iterable[EdgeConfig]) -> dict[str, list[str]]:
    succ: dict[str, list[str]] = {}
    for e in edges:
        succ.setdefault(e.src, []).append(e.dst)
    return succ


def topo_order(names: list[str], edges: Iterable[EdgeConfig]) -> list[str]:
    """Kahn's algorithm; ties go to the earlier-declared stage so the order is stable."""
    index = {n: i for i, n in enumerate(names)}
    succ = successors(edges)
    indegree = dict.fromkeys(names, 0)
    for dsts in succ.values():
        for d in dsts:
            indegree[d] += 1
    ready = [index[n] for n in names if indegree[n] == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        order.append(names[heapq.heappop(ready)])
        for d in succ.get(order[-1], ()):
            indegree[d] -= 1
            if indegree[d] == 0:
                heapq.heappush(ready, index[d])
    return order


def find_cycle(names: list[str], edges: Iterable[EdgeConfig]) -> list[str] | None:
    """One cycle as a path that starts and ends on the same stage, or None."""
    succ, state, stack = successors(edges), {}, []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in succ.get(node, ()):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    return next((c for n in names if n not in state and (c := visit(n))), None)


def ancestors(edges: Iterable[EdgeConfig], targets: Iterable[str]) -> set[str]:
    """`targets` plus every stage with a path to one of them."""
    preds: dict[str, list[str]] = {}
    for e in edges:
        preds.setdefault(e.dst, []).append(e.src)
    seen = set(targets)  # materialise first: `targets` may be a one-shot generator
    todo = list(seen)
    while todo:
        for p in preds.get(todo.pop(), ()):
            if p not in seen:
                seen.add(p)
                todo.append(p)
    return seen


def check_acyclic(src: str, stages: Stages, edges: Edges) -> None:
    cycle = find_cycle([s.name for s in stages], edges)
    if cycle:
        raise ConfigError(src, "edges", f"the stages form a cycle: {' -> '.join(cycle)}",
                          "A pipeline is acyclic; remove one of these edges")


def parse_outputs(src: str, raw: object, stages: Stages) -> dict[str, tuple[str, ...]]:
    if raw is None:
        outputs = _outputs_from_stages(stages)
    else:
        outputs = _explicit_outputs(src, raw, stages)
        _check_finals_listed(src, stages, outputs)
    if not outputs:
        raise ConfigError(src, "outputs", "the pipeline has no output modality",
                          "Set 'final_output: text' (or another modality) on the stage "
                          "whose output goes to the client")
    return outputs


def _outputs_from_stages(stages: Stages) -> dict[str, tuple[str, ...]]:
    # Without an explicit `outputs:`, each modality needs every stage that emits it.
    outputs: dict[str, list[str]] = {}
    for s in stages:
        if s.final_output is not None:
            outputs.setdefault(s.final_output, []).append(s.name)
    return {m: tuple(names) for m, names in outputs.items()}


def _explicit_outputs(src: str, raw: object, stages: Stages) -> dict[str, tuple[str, ...]]:
    by_name = {s.name: s for s in stages}
    outputs: dict[str, tuple[str, ...]] = {}
    for modality, listed in as_mapping(src, "outputs", raw).items():
        path = f"outputs.{modality}"
        items = as_list(src, path, listed if listed is not None else [])
        if not items:
            raise ConfigError(src, path, f"modality '{modality}' lists no stages",
                              f"List the stage(s) that emit it, e.g. '{modality}: [stage]', or remove it")
        names = [_output_stage(src, f"{path}[{j}]", n, modality, by_name) for j, n in enumerate(items)]
        outputs[modality] = tuple(dict.fromkeys(names))
    return outputs


def _output_stage(src: str, path: str, name: object, modality: str, by_name: Mapping[str, StageConfig]) -> str:
    if not isinstance(name, str) or name not in by_name:
        raise ConfigError(src, path, f"unknown stage {name!r}", did_you_mean(name, by_name))
    actual = by_name[name].final_output
    if actual != modality:
        shown = "no final_output" if actual is None else f"final_output '{actual}'"
        raise ConfigError(src, path, f"stage '{name}' has {shown}, not '{modality}'",
                          f"Set 'final_output: {modality}' on stage '{name}'")
    return name


def _check_finals_listed(src: str, stages: Stages, outputs: Outputs) -> None:
    for i, s in enumerate(stages):
        m = s.final_output
        if m is not None and s.name not in outputs.get(m, ()):
            raise ConfigError(src, f"stages[{i}].final_output",
                              f"stage '{s.name}' emits '{m}' but outputs.{m} does not list it",
                              f"Add '{s.name}' to outputs.{m}, or remove final_output")


def check_all_needed(src: str, stages: Stages, edges: Edges, outputs: Outputs) -> None:
    # A stage off every route would load weights and hold devices for nothing.
    needed = ancestors(edges, (s for finals in outputs.values() for s in finals))
    for i, s in enumerate(stages):
        if s.name not in needed:
            raise ConfigError(src, f"stages[{i}]",
                              f"stage '{s.name}' is not needed by any output modality (no path to a final stage)",
                              "Connect it with an edge or remove it")


def parse_defaults(src: str, raw: object, outputs: Outputs) -> tuple[str, ...]:
    if raw is None:
        return (next(iter(outputs)),)
    items = as_list(src, "default_modalities", raw)
    if not items:
        raise ConfigError(src, "default_modalities", "the list is empty",
                          "Remove the key to default to the first output modality")
    for j, m in enumerate(items):
        if not isinstance(m, str) or m not in outputs:
            raise ConfigError(src, f"default_modalities[{j}]", f"modality {m!r} is not in outputs",
                              did_you_mean(m, outputs))
    return tuple(dict.fromkeys(items))
