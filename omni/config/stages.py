"""A pipeline's stages and edges as frozen dataclasses (omni/config/pipeline.py parses
them from the YAML file and checks them)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from omni.config.devices import default_devices
from omni.config.frozen import Picklable, set_field
from omni.config.placement import LOCAL, Placement


def _frozen(value: Mapping[str, Any]) -> Mapping[str, Any]:
    # A deep copy so that later edits to the caller's dict cannot leak into the config.
    return MappingProxyType(copy.deepcopy(dict(value)))


@dataclass(frozen=True)
class StageConfig(Picklable):
    """One stage: a model component run by one engine kind on a resource budget."""

    name: str
    engine: str
    model: str | None = None
    model_dir: str | None = None
    devices: tuple[str, ...] = ()  # empty: default_devices(engine), auto but for echo
    replicas: int = 1
    memory: int | None = None
    memory_share: float | None = None  # `memory: 60%` (omni/config/memory.py)
    # dict defaults are frozen (MappingProxyType of a deep copy) in __post_init__
    params: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    final_output: str | None = None
    restart: bool = False  # start a new process when a replica dies
    launch: str = "local"  # "external": replicas connect themselves (python -m omni.engines.proc)
    inputs: tuple[str, ...] = ("text",)  # what it takes from a client, as an entry stage
    takes_request: tuple[str, ...] = ()  # client input keys it also gets when fed by others
    placement: Placement = LOCAL  # where its replicas run (omni/config/placement.py)
    # the interpreter its replicas run with (omni/config/environments.py); None: the server's
    python: str | None = None

    def __post_init__(self) -> None:
        set_field(self, "devices", tuple(self.devices) or default_devices(self.engine))
        set_field(self, "inputs", tuple(self.inputs))
        set_field(self, "takes_request", tuple(self.takes_request))
        set_field(self, "params", _frozen(self.params))
        set_field(self, "options", _frozen(self.options))


@dataclass(frozen=True)
class EdgeConfig:
    """Producer stage `src` feeds consumer stage `dst`."""

    src: str
    dst: str
    payload: str = "data"
    delivery: str = "full"
    connector: str = "auto"
    max_lead: int | None = None  # stream flow control: omni/runtime/lead.py
