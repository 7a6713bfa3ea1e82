"""Where a stage's replicas run: the `devices` field, its check and its default.

A stage lists devices; replica *i* runs on ``devices[i % len(devices)]``. Each is
``cpu``, ``cuda``, ``cuda:N`` or ``auto``. ``auto`` is resolved inside the engine
process (``omni.engines.base.resolve_device``): ``cuda`` (the first visible GPU) when torch
sees one, else ``cpu``. So ``devices: [auto]`` with several replicas puts every replica
on the same GPU, cuda:0 of the process's ``CUDA_VISIBLE_DEVICES``; list ``cuda:N``
devices to spread them.

The default is decided by engine kind (``default_device`` in omni/engines/kinds.py): a
model stage defaults to ``[auto]``, so a model runs on the GPU when there is one without
its pipeline file saying so; a kind that loads no model (``echo``) stays on ``[cpu]``.
"""

from __future__ import annotations

import re

from omni.config.checks import ConfigError, as_list, is_index
from omni.engines.kinds import default_device

DEVICE_FIX = "Use 'auto', 'cpu', 'cuda' or 'cuda:N' (N an integer >= 0)"

_DEVICE_RE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


def default_devices(engine: object) -> tuple[str, ...]:
    """The devices of a stage that names none: its engine kind's default device."""
    return (default_device(engine),)


def check_device(src: str, path: str, value: object) -> str:
    """'auto', 'cpu', 'cuda' or 'cuda:N', normalised ('cuda:01' -> 'cuda:1').

    'auto' is resolved in the engine process: a GPU when one is visible, else the CPU.
    """
    if value == "auto":
        return value
    match = _DEVICE_RE.match(value) if isinstance(value, str) else None
    if match is None or (match.group(1) == "cpu" and match.group(2) is not None):
        hint = f"Did you mean 'cuda:{value}'? " if is_index(value) else ""
        raise ConfigError(src, path, f"bad device {value!r}", hint + DEVICE_FIX)
    kind, index = match.groups()
    return kind if index is None else f"{kind}:{int(index)}"


def check_devices(src: str, path: str, value: object) -> tuple[str, ...]:
    """A non-empty list of devices (a lone string is one item)."""
    items = as_list(src, path, value)
    if not items:
        raise ConfigError(src, path, "the device list is empty", "Use e.g. [cpu] or [cuda:0]")
    return tuple(check_device(src, f"{path}[{i}]", d) for i, d in enumerate(items))
