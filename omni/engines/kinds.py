"""The engine kinds: the one table that names them (a stage's ``engine`` field).

Everything that depends on a stage's kind reads it here: the config check (which kinds
exist), a stage's default devices, the fork server's preload, which stages keep
per-session state, and how the engine process builds the engine. Adding a kind is one
row below plus its engine package; tests/unit/test_engine_kinds.py fails on a kind named
anywhere else in omni/.

Cheap to import on purpose (the orchestrator and the config checks read it): nothing of
an engine is imported until ``load_builder`` runs, inside the engine process.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineKind:
    name: str
    # "module:function", function(spec: EngineSpec) -> Engine: the engine of a stage's spec
    builder: str
    # where a stage that lists no devices runs: 'auto' (a GPU when there is one) for a
    # model, 'cpu' for a kind that loads none
    default_device: str = "auto"
    # the fork server imports torch and transformers once before forking engines of
    # this kind (omni/runtime/processes.py); a kind that loads no model skips that
    preload: bool = True
    # its requests carry a ``session`` param: the engine keeps state per session
    # (AR: KV blocks; policy: the episode; diffusion: a world adapter's frames)
    stateful: bool = False
    # the omni/models registry of the model adapters it drives: a stage of this kind must
    # name one in its ``model`` field (None: the kind needs no adapter name)
    adapters: str | None = None
    # its stages take the option ``quantization`` (QUANTIZATIONS, or none), and the server
    # flag --quantization applies to them (omni/engines/quantization/)
    quantizes: bool = False
    # its stages take the option ``load_format`` (omni.engines.base.LOAD_FORMATS: dummy
    # draws random weights), and the server flag --load-format applies to them
    dummy_weights: bool = False


# the order of the config's error texts and of tests/unit/test_config.py (constants) and
# test_config_errors.py (the unknown-engine message)
KINDS: dict[str, EngineKind] = {kind.name: kind for kind in (
    EngineKind("ar", "omni.engines.ar.build:stage_engine", stateful=True, quantizes=True,
               dummy_weights=True),
    EngineKind("vllm", "omni.engines.vllm.engine:stage_engine"),
    EngineKind("generation", "omni.engines.generation.build:stage_engine",
               adapters="GENERATION_RUNNERS"),
    EngineKind("diffusion", "omni.engines.diffusion.engine:stage_engine", stateful=True,
               adapters="DIFFUSION_DENOISERS", quantizes=True, dummy_weights=True),
    EngineKind("policy", "omni.engines.policy.engine:stage_engine", stateful=True,
               adapters="POLICIES"),
    EngineKind("echo", "omni.engines.echo.engine:stage_engine", default_device="cpu",
               preload=False),
)}

ENGINE_KINDS = tuple(KINDS)
QUANTIZATIONS = ("none", "fp8")  # a stage's option ``quantization`` (none: the model's dtype)
QUANTIZING_KINDS = tuple(name for name, kind in KINDS.items() if kind.quantizes)
DUMMY_WEIGHT_KINDS = tuple(name for name, kind in KINDS.items() if kind.dummy_weights)
STATEFUL_KINDS = frozenset(name for name, kind in KINDS.items() if kind.stateful)


def available() -> str:
    """The kinds, for error texts: 'ar, diffusion, echo, ...'."""
    return ", ".join(sorted(KINDS))


def default_device(name: object) -> str:
    """The device of a stage of kind ``name`` that lists none ('auto' for an unknown name:
    the config check refuses it on its own)."""
    kind = KINDS.get(name) if isinstance(name, str) else None
    return "auto" if kind is None else kind.default_device


def preloads(names: Iterable[str]) -> bool:
    """Whether engines of any of these kinds want the fork server's preload (an unknown
    name does: a model engine is the safe guess)."""
    return any(name not in KINDS or KINDS[name].preload for name in names)


def load_builder(kind: EngineKind) -> Callable[[Any], Any]:
    """The kind's builder, imported now (in the engine process: torch comes with it)."""
    module, _, function = kind.builder.partition(":")
    return getattr(importlib.import_module(module), function)
