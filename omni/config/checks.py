"""Validation helpers for omni.config.pipeline; every failure is a ConfigError.

Kept apart from config.py so the schema module stays readable. They are typed field
readers that see only a source (file name), a field path and a value, which is exactly
what a good error message needs; the graph checks (cycles, outputs, unused stages) are
in graph.py.
"""

from __future__ import annotations

import copy
import difflib
import math
import os
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

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


def check_memory(src: str, path: str, value: object) -> int:
    """A memory budget in bytes, or a ConfigError naming the accepted forms."""
    try:
        return parse_memory(value)  # type: ignore[arg-type]
    except ValueError:
        raise ConfigError(src, path, f"bad memory value {value!r}", MEMORY_FIX) from None
