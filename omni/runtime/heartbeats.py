"""Late heartbeats as a question: every engine process sends a heartbeat each
``heartbeat_s`` from its own thread and socket (omni/engines/proc/channel.py); a live
replica silent for two intervals is asked whether it is gone or only busy (liveness.py:
its process state for a local one, its libzmq link for a remote one), and is declared
dead only when gone, or when it stays silent past ``hang_timeout_s`` (hung). A timer
checks; nothing polls. Heartbeats queued behind a busy event loop are read before anyone
is judged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

from omni.runtime.liveness import SlowLog
from omni.runtime.pool import Replica

# (why it cannot serve, or None; what says it is alive), for a replica gone silent
Probe = Callable[[Replica], tuple[str | None, str]]


class HeartbeatWatch:
    """Checks an engine group's replicas every interval (0: never); ``drain`` reads what
    the routers hold, ``probe`` tells gone from busy (liveness.py), ``on_silent(replica,
    reason)`` declares one dead (EngineGroup)."""

    def __init__(self, interval_s: float, replicas: Mapping[str, Replica],
                 drain: Callable[[], None], on_silent: Callable[[Replica, str], None],
                 probe: Probe, hang_s: float = 0.0) -> None:
        self.interval_s = interval_s
        self.hang_s = hang_s  # silent this long while alive: hung (0: never)
        self.replicas = replicas  # the group's, by replica id
        self._drain = drain
        self._on_silent = on_silent
        self._probe = probe
        self.slow = SlowLog()
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
        """Judge every live replica silent for two heartbeat intervals."""
        if self._stopped:
            return
        self._drain()  # heartbeats queued behind a busy loop count
        now = time.monotonic()
        for replica in list(self.replicas.values()):
            silent = now - replica.last_heartbeat
            if replica.alive and silent > 2 * self.interval_s:
                reason = self._verdict(replica, silent)
                if reason is not None:
                    self._on_silent(replica, reason)
        self._timer = loop.call_later(self.interval_s, self._check, loop)

    def _verdict(self, replica: Replica, silent: float) -> str | None:
        """Why the silent replica is dead, or None (it is busy: warned, rate-limited)."""
        late = f"no heartbeat for {silent:.1f} s (interval {self.interval_s:g} s)"
        gone, alive = self._probe(replica)
        if gone is not None:
            return f"{late}: {gone}"
        if self.hang_s and silent > self.hang_s:
            return (f"{late}: hung ({alive}, but it has sent nothing for longer than "
                    f"hang_timeout_s, {self.hang_s:g} s)")
        self.slow.late(replica.replica_id, silent, alive)
        return None
