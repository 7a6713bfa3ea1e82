"""Frozen config dataclasses: normalising fields after init, and pickling them (configs are
sent to spawned engine processes)."""

from __future__ import annotations

from dataclasses import fields
from types import MappingProxyType
from typing import Any


def set_field(obj: object, name: str, value: object) -> None:
    # Normalising fields in __post_init__ of a frozen dataclass needs the back door.
    object.__setattr__(obj, name, value)


class Picklable:
    """Pickle support: MappingProxyType cannot be pickled, and configs are sent to
    spawned engine processes. Rebuild from plain fields; __post_init__ re-freezes them,
    and cached indexes/routes are rebuilt on demand instead of being shipped."""

    def __reduce__(self) -> tuple[Any, ...]:
        values = (getattr(self, f.name) for f in fields(self))  # type: ignore[arg-type]
        return (type(self), tuple(dict(v) if isinstance(v, MappingProxyType) else v for v in values))
