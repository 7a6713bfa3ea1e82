"""Busy or gone: what decides that a replica whose heartbeats are late is dead.

An engine's heartbeats come from a Python thread (omni/engines/proc/channel.py). On a
machine loaded several times over its cores that thread can wait seconds for a CPU or
for the GIL, and a late heartbeat then looks exactly like a stopped process (issue 43:
``tts/0`` and ``vad/0`` declared dead mid-session at a load of 6 on 2 cores, though both
were only starved). So a late heartbeat is a question, and the answer comes from
something that does not need the engine's Python to run:

- **Local replicas** (processes this server forked): the kernel. ``/proc/PID/stat``'s
  state: ``T``/``t`` (stopped: SIGSTOP, a debugger) cannot serve and is dead, as fast as
  before (the check that found the heartbeat late); ``Z``/``X`` or no such process has
  exited (its sentinel says how, at once); anything else (``R`` running or waiting for a
  CPU, ``S`` sleeping, ``D`` in the kernel) is alive: busy, not dead. Real deaths never
  waited for heartbeats: the process sentinel reports an exit the moment it happens.
- **Remote replicas** (Ray actors on other hosts, ``launch: external`` processes started
  by ``python -m omni.engines.proc --connect``): the server cannot read their ``/proc``.
  Their link is watched by ZMTP heartbeats instead (``ZMQ_HEARTBEAT_IVL`` and
  ``ZMQ_HEARTBEAT_TIMEOUT`` on the server's ROUTER, omni/runtime/control.py): libzmq's
  I/O thread pings every connection each half ``heartbeat_s`` and closes one whose peer
  has not answered a ping within 1.5 intervals, so a dead link is gone within two
  intervals of its last word, as fast as the old rule judged. Those pings are answered
  by the peer's libzmq I/O thread, a native thread that needs neither the GIL nor the
  engine's Python threads, so a starved engine still answers while a stopped process or
  a cut-off host does not. Only routers that such replicas reach run them: a link closed
  under a starved local child would lose the messages queued on it.
  A closed connection drops the peer's routing id from the ROUTER; a replica whose
  heartbeats are late is asked whether its heartbeat socket is still routable
  (``ControlRouter.reaches``), and is dead when it is not. The app heartbeats stay (they
  carry the replica id, and they are what says "late" in the first place).

Either way, a replica that is alive by these signs but has sent nothing for
``hang_timeout_s`` (default 60 s, 0 = never) is declared hung: a process that answers
the kernel or libzmq but whose Python has not run for a minute (a deadlock holding the
GIL) serves nobody. Late heartbeats short of that are logged as a warning per replica,
at most once per SLOW_LOG_EVERY_S.
"""

from __future__ import annotations

import logging
import os
import time

from omni.runtime.control import ControlRouter
from omni.runtime.pool import Replica
from omni.wire.protocol import HEARTBEAT_SUFFIX

log = logging.getLogger("omni.runtime.launcher")

SLOW_LOG_EVERY_S = 30.0  # one "slow heartbeat" warning per replica this often, at most
HAS_PROC = os.path.exists("/proc/self/stat")  # where there is none, silence is death again
STOPPED, EXITED = "Tt", "ZX"


def process_state(pid: int) -> str | None:
    """The one-letter state of a process from /proc/PID/stat, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: the state follows the last ')'
    fields = stat.rsplit(b")", 1)[-1].split()
    return fields[0].decode("ascii", "replace") if fields else None


def local_gone(pid: int | None) -> str | None:
    """Why a process of ours that missed its heartbeats cannot serve, or None when the
    kernel says it is alive (running, runnable, sleeping or in the kernel)."""
    if pid is None or not HAS_PROC:
        return "stopped or unreachable"
    state = process_state(pid)
    if state is None or state in EXITED:
        return f"process {pid} has exited"
    if state in STOPPED:
        return f"process {pid} is stopped (state {state}: SIGSTOP or a debugger)"
    return None


class SlowLog:
    """Rate-limited warnings of late heartbeats from replicas that are alive."""

    def __init__(self, every_s: float = SLOW_LOG_EVERY_S) -> None:
        self.every_s = every_s
        self._last: dict[str, float] = {}
        self.count = 0  # late checks of live replicas so far (each is a false death avoided)

    def late(self, replica_id: str, silent_s: float, why_alive: str) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self._last.get(replica_id, -self.every_s) >= self.every_s:
            self._last[replica_id] = now
            log.warning("slow heartbeat: replica %s has sent none for %.1f s, but %s: busy, "
                        "not dead (a loaded machine?); not declared dead", replica_id,
                        silent_s, why_alive)


def probe(replica: Replica, router: ControlRouter, local: bool) -> tuple[str | None, str]:
    """For a replica whose heartbeats are late: (why it cannot serve, or None; what says
    it is alive). ``local``: its process is a child of this server (else only its link
    on ``router`` can tell)."""
    if local:
        pid = replica.process.pid if replica.process is not None else None
        return local_gone(pid), f"its process {pid} is alive (state {process_state(pid)})"
    if router.reaches(replica.identity + HEARTBEAT_SUFFIX):
        return None, "its connection still answers libzmq's heartbeats"
    return ("its connection timed out (libzmq heartbeats): stopped or "
            "unreachable"), ""
