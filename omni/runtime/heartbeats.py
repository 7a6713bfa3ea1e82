"""Silence as death: every engine process sends a heartbeat each ``heartbeat_s`` from its
own thread and socket (omni/engines/proc/channel.py), and a live replica silent for two
intervals is declared dead (a stopped or unreachable process). A timer checks; nothing
polls. Heartbeats queued behind a busy event loop are read before anyone is judged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

from omni.runtime.pool import Replica


class HeartbeatWatch:
    """Checks an engine group's replicas every interval (0: never); ``drain`` reads what
    the routers hold, ``on_silent(replica, reason)`` declares one dead (EngineGroup)."""

    def __init__(self, interval_s: float, replicas: Mapping[str, Replica],
                 drain: Callable[[], None], on_silent: Callable[[Replica, str], None]) -> None:
        self.interval_s = interval_s
        self.replicas = replicas  # the group's, by replica id
        self._drain = drain
        self._on_silent = on_silent
        self._timer: asyncio.TimerHandle | None = None
        self._stopped = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.interval_s:
            self._timer = loop.call_later(self.interval_s, self._check, loop)

    def stop(self) -> None:
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        """Declare dead every live replica silent for two heartbeat intervals."""
        if self._stopped:
            return
        self._drain()  # heartbeats queued behind a busy loop count
        now = time.monotonic()
        for replica in self.replicas.values():
            silent = now - replica.last_heartbeat
            if replica.alive and silent > 2 * self.interval_s:
                self._on_silent(replica, f"no heartbeat for {silent:.1f} s (interval "
                                         f"{self.interval_s:g} s): stopped or unreachable")
        self._timer = loop.call_later(self.interval_s, self._check, loop)
