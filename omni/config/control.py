"""Pipeline settings of the control plane: where its ROUTER binds, how often engines beat,
how long a live but silent replica may stay so (omni/runtime/liveness.py)."""

from __future__ import annotations

import math

from omni.config.checks import ConfigError, describe
from omni.wire.protocol import check_address


def parse_control_bind(src: str, value: object) -> str | None:
    """`control_bind`: ipc://PATH or a loopback tcp://HOST:PORT (PORT may be *)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(src, "control_bind", f"expected a string, got {describe(value)}",
                          "Write e.g. tcp://127.0.0.1:5555 or tcp://127.0.0.1:*")
    try:
        return check_address(value)
    except ValueError as exc:
        raise ConfigError(src, "control_bind", str(exc),
                          "Leave it out (a private ipc:// socket) or use a loopback "
                          "tcp:// address") from None


def parse_heartbeat(src: str, value: object) -> float:
    """`heartbeat_s`: seconds between an engine's heartbeats (>= 0.05), or 0 for none."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and (value == 0 or value >= 0.05)):
        raise ConfigError(src, "heartbeat_s", f"expected 0 or a number >= 0.05, got "
                          f"{describe(value)}", "Use e.g. 2 (seconds); 0 turns heartbeats off")
    return float(value)


def parse_hang_timeout(src: str, value: object) -> float:
    """`hang_timeout_s`: seconds a replica whose process (or link) is alive may send no
    heartbeat before it is declared hung; 0 for never."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value >= 0):
        raise ConfigError(src, "hang_timeout_s", f"expected a number >= 0, got "
                          f"{describe(value)}", "Use e.g. 60 (seconds); 0 never declares a "
                          "live replica hung")
    return float(value)
