"""Validation helpers for omni.config.pipeline; every failure is a ConfigError.

Kept apart from config.py so the schema module stays readable. The first half are
typed field readers that see only a source (file name), a field path and a value,
which is exactly what a good error message needs; the second half are the graph
checks (cycles, outputs, unused stages), which only read stage/edge attributes.
"""

from __future__ import annotations

import copy
import difflib
import heapq
import math
import os
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # runtime import would be circular; only the annotations need these
    from omni.config.pipeline import EdgeConfig, StageConfig

    Stages = tuple[StageConfig, ...]
    Edges = tuple[EdgeConfig, ...]
    Outputs = Mapping[str, tuple[str, ...]]

MEMORY_FIX = (
    "Use an integer number of bytes or a size like '512MiB', '2GiB', '1.5GB' "
    "(units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
)

# Decimal units are powers of 1000, binary (IEC) units powers of 1024, as on disk labels.
_MEMORY_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_STAGE_NAME_RE = re.compile(r"^[a-z0-9_-]+$")
_MEMORY_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")
_YAML_TYPE_NAMES = {
    bool: "boolean", int: "integer", float: "number", str: "string",
    list: "list", dict: "mapping", type(None): "null",
}


class ConfigError(ValueError):
    """A pipeline file problem, formatted '<source>: <field path>: <problem>. <fix>'."""

    def __init__(self, source: str, path: str, problem: str, fix: str = "") -> None:
        self.source, self.path, self.problem, self.fix = source, path, problem, fix
        message = f"{source}: {path}: {problem}."
        super().__init__(f"{message} {fix}" if fix else message)

    def __reduce__(self) -> tuple[Any, ...]:
        # Errors may cross process boundaries (spawned engines); keep them picklable.
        return (type(self), (self.source, self.path, self.problem, self.fix))


def join(path: str, key: object) -> str:
    """Field path of `key` inside `path` ('' is the top level)."""
    return f"{path}.{key}" if path else str(key)


def describe(value: object) -> str:
    """A value as the YAML author wrote it, e.g. "string '2'" or 'integer 5'."""
    kind = _YAML_TYPE_NAMES.get(type(value), type(value).__name__)
    return kind if value is None else f"{kind} {value!r}"


def did_you_mean(word: object, choices: Iterable[str]) -> str:
    """Fix text: the closest valid choice (if any) and the full list of valid ones."""
    options = sorted(choices)
    close = difflib.get_close_matches(str(word), options, n=1, cutoff=0.6)
    hint = f"Did you mean '{close[0]}'? " if close else ""
    return f"{hint}Valid: {', '.join(options)}"


def check_keys(src: str, path: str, data: Mapping[Any, Any], allowed: Iterable[str]) -> None:
    """Reject unknown keys: a typo must not silently fall back to a default."""
    allowed = tuple(allowed)
    for key in data:
        if key not in allowed:
            raise ConfigError(src, join(path, key), f"unknown key '{key}'", did_you_mean(key, allowed))


def require(src: str, path: str, data: Mapping[str, Any], key: str, example: str) -> Any:
    """The value of a required key; missing and null are both errors."""
    value = data.get(key)
    if value is None:
        raise ConfigError(src, join(path, key), "missing required field", f"Add '{key}: {example}'")
    return value


def optional(data: Mapping[str, Any], key: str, default: Any) -> Any:
    """The value of an optional key; an empty YAML value (`key:`) means the default."""
    value = data.get(key)
    return default if value is None else value


def as_str(src: str, path: str, value: object) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(src, path, f"expected a non-empty string, got {describe(value)}",
                          "Write a plain word or quoted text")
    return value


def opt_str(src: str, path: str, value: object) -> str | None:
    """A non-empty string or None."""
    return None if value is None else as_str(src, path, value)


def as_int(src: str, path: str, value: object, minimum: int) -> int:
    """An integer >= minimum. YAML booleans are ints in Python but never what was meant."""
    if isinstance(value, bool) or not isinstance(value, int):
        fix = "Write it without quotes" if isinstance(value, str) else "Write a whole number"
        raise ConfigError(src, path, f"expected an integer, got {describe(value)}",
                          f"{fix}, e.g. {minimum}")
    if value < minimum:
        raise ConfigError(src, path, f"must be >= {minimum}, got {value}", f"Use {minimum} or more")
    return value


def as_bool(src: str, path: str, value: object) -> bool:
    """true/false only: 'yes' or 1 in a YAML file is more likely a slip than a choice."""
    if not isinstance(value, bool):
        raise ConfigError(src, path, f"expected true or false, got {describe(value)}",
                          "Write true or false")
    return value


def as_positive_float(src: str, path: str, value: object) -> float:
    """A finite number > 0, returned as float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(src, path, f"expected a number, got {describe(value)}",
                          "Write a number without quotes, e.g. 600")
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(src, path, f"must be a finite number > 0, got {value}", "Use e.g. 600")
    return float(value)


def as_mapping(src: str, path: str, value: object, allow_none: bool = True) -> dict[str, Any]:
    """A deep-copied mapping with string keys; null means empty where allowed."""
    if value is None and allow_none:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(src, path, f"expected a mapping, got {describe(value)}",
                          "Write 'key: value' pairs, or {} for none")
    for key in value:
        if not isinstance(key, str):
            raise ConfigError(src, join(path, key), f"key {describe(key)} is not a string",
                              "Quote the key")
    return copy.deepcopy(dict(value))


def as_list(src: str, path: str, value: object, wrap_str: bool = True) -> list[Any]:
    """A list; a lone string is wrapped since `devices: cuda` clearly means one item."""
    if isinstance(value, str) and wrap_str:
        return [value]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(src, path, f"expected a list, got {describe(value)}",
                          "Write a YAML list, e.g. [a, b]")
    return list(value)


def edge_end(src: str, path: str, raw: Mapping[str, Any], key: str, names: list[str]) -> str:
    """An edge's `from` or `to`: the name of a stage of the pipeline."""
    value = as_str(src, f"{path}.{key}", require(src, path, raw, key, "<stage name>"))
    if value not in names:
        raise ConfigError(src, f"{path}.{key}", f"unknown stage '{value}'", did_you_mean(value, names))
    return value


def check_choice(src: str, path: str, value: object, choices: Iterable[str], what: str) -> str:
    """`value` must be one of `choices`."""
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(src, path, f"unknown {what} {value!r}", did_you_mean(value, choices))
    return value


def check_stage_name(src: str, path: str, raw: Mapping[str, Any]) -> str:
    """A stage's `name`: lowercase letters, digits, '_' and '-', not 'stream'."""
    name = as_str(src, f"{path}.name", require(src, path, raw, "name", "my_stage"))
    if not _STAGE_NAME_RE.match(name):
        fixed = re.sub(r"[^a-z0-9_-]+", "_", name.lower()).strip("_") or "stage"
        raise ConfigError(src, f"{path}.name", f"bad stage name {name!r}",
                          f"Use lowercase letters, digits, '_' and '-' only, e.g. '{fixed}'")
    if name == "stream":  # engines read inputs["stream"] as the list of stream producers
        raise ConfigError(src, f"{path}.name", "'stream' is a reserved name", "Pick another")
    return name


def model_dir_path(src: str, path: str, value: object, base_dir: str | None) -> str | None:
    """An absolute model_dir; relative to the YAML file (`base_dir`), not the server's
    cwd, so a file plus its weights can move."""
    if value is None:
        return None
    expanded = os.path.expanduser(as_str(src, path, value))
    return os.path.abspath(os.path.join(base_dir or os.getcwd(), expanded))


def is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_memory(value: int | str) -> int:
    """Bytes from an int or a size string: '2GiB' -> 2 * 1024**3, '1.5GB' -> 1_500_000_000.

    Raises ValueError (whose text includes the accepted forms) on bad input; callers
    parsing a file re-raise it as ConfigError with the field path.
    """
    if is_index(value):
        return _positive_bytes(value, value)
    match = _MEMORY_RE.match(value) if isinstance(value, str) else None
    unit = _MEMORY_UNITS.get(match.group(2).lower()) if match else None
    if match is None or unit is None:
        raise ValueError(f"bad memory value {value!r}. {MEMORY_FIX}")
    try:
        exact = Decimal(match.group(1)) * unit  # Decimal: '1.5GB' must be exact, not 1.4999e9
    except InvalidOperation:  # pragma: no cover - the regex only lets numbers through
        raise ValueError(f"bad memory value {value!r}. {MEMORY_FIX}") from None
    if exact != exact.to_integral_value():
        raise ValueError(f"memory value {value!r} is not a whole number of bytes. {MEMORY_FIX}")
    return _positive_bytes(value, int(exact))


def _positive_bytes(value: object, nbytes: int) -> int:
    if nbytes < 1:
        raise ValueError(f"memory value {value!r} must be at least 1 byte. {MEMORY_FIX}")
    return nbytes


# ----------------------------------------------------------------------------- graph


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


def check_memory(src: str, path: str, value: object) -> int:
    """A memory budget in bytes, or a ConfigError naming the accepted forms."""
    try:
        return parse_memory(value)  # type: ignore[arg-type]
    except ValueError:
        raise ConfigError(src, path, f"bad memory value {value!r}", MEMORY_FIX) from None
