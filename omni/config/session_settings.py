"""A pipeline's session settings (the ``sessions:`` key; the primitive is omni/session/)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omni.config.checks import ConfigError, as_int, as_positive_float, describe

SESSION_KEYS = ("max_sessions", "idle_ttl_s", "resume_grace_s", "state_budget_mb")


@dataclass(frozen=True)
class SessionSettings:
    max_sessions: int = 64  # one more is refused at once (a WebSocket closes with 1013)
    idle_ttl_s: float = 600.0  # a session unused this long is closed
    resume_grace_s: float = 30.0  # a detached session waits this long for its client
    # engine state (KV) kept for sessions; over it, the least recently used session's
    # state is dropped (the session stays). None: half of the AR stages' KV caches
    state_budget_mb: float | None = None

    def replace(self, **changes: Any) -> SessionSettings:
        return SessionSettings(**{**self.__dict__, **changes})


def parse_sessions(src: str, raw: object) -> SessionSettings:
    if raw is None:
        return SessionSettings()
    if not isinstance(raw, Mapping):
        raise ConfigError(src, "sessions", f"expected a mapping, got {describe(raw)}",
                          "Write e.g. 'sessions: {max_sessions: 64, idle_ttl_s: 600}'")
    unknown = sorted(set(raw) - set(SESSION_KEYS))
    if unknown:
        raise ConfigError(src, "sessions", f"unknown key(s) {', '.join(map(str, unknown))}",
                          f"The keys are {', '.join(SESSION_KEYS)}")
    default = SessionSettings()
    budget = raw.get("state_budget_mb")
    return SessionSettings(
        max_sessions=as_int(src, "sessions.max_sessions",
                            raw.get("max_sessions", default.max_sessions), 1),
        idle_ttl_s=as_positive_float(src, "sessions.idle_ttl_s",
                                     raw.get("idle_ttl_s", default.idle_ttl_s)),
        resume_grace_s=as_positive_float(src, "sessions.resume_grace_s",
                                         raw.get("resume_grace_s", default.resume_grace_s)),
        state_budget_mb=None if budget is None else as_positive_float(
            src, "sessions.state_budget_mb", budget))
