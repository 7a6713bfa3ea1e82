"""A dead replica's next incarnation, and how long a crashed one waits for it.

EngineGroup (launcher.py) starts a replica of a stage with ``restart: true`` again when
it dies after it was ready, after a backoff that follows its crash streak (a crash loop
must not spin the CPU); an external replica's slot (``launch: external``) waits for a
newer incarnation to connect. Each incarnation has its own DEALER identity
(omni/wire/protocol.py), so whatever its predecessor still sends is ignored; one that
fails to load again stays down, its error logged.
"""

from __future__ import annotations

import asyncio
import logging
import time

from omni.runtime.pool import Replica

log = logging.getLogger("omni.runtime.launcher")

RESTART_BACKOFF_S = (0.0, 1.0, 2.0, 5.0, 10.0, 30.0)  # a crash loop must not spin the CPU
# a replica that stayed up this long before dying was not crash-looping: its backoff starts
# over (bench soak: with a lifetime count, outages grew from 1.5 to 5.1 s over 18 kills)
STABLE_UP_S = 60.0


def restart_delay(replica: Replica) -> float:
    """The backoff before the replica's next start, by its crash streak (which starts over
    when it stayed up STABLE_UP_S)."""
    if time.monotonic() - replica.ready_at >= STABLE_UP_S:
        replica.crash_streak = 0
    return RESTART_BACKOFF_S[min(replica.crash_streak, len(RESTART_BACKOFF_S) - 1)]


def next_incarnation(replica: Replica, loop: asyncio.AbstractEventLoop) -> None:
    """The replica's slot waits for its next incarnation: a new identity, a new READY."""
    replica.incarnation += 1
    replica.exit_reason = None
    replica.ready = loop.create_future()
    replica.ready.add_done_callback(_restarted)


def _restarted(ready: asyncio.Future) -> None:
    if not ready.cancelled() and ready.exception() is not None:
        log.error("%s", ready.exception())  # it failed to load again: stays down
