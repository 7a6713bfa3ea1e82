"""The process side of the netns harness: the machine's process table read from /proc, and
killing a set of processes (a Ray node's session, a namespace's processes) as a host losing
power would, waiting until they are gone."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path


def _pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, session id, command line) of every live (non-zombie) process."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # the name may hold spaces and ')'
        if fields[0] != "Z":
            table[int(entry.name)] = (int(fields[1]), int(fields[3]), cmdline)
    return table


def _kill_and_wait(pids: Iterable[int], timeout: float = 10.0) -> None:
    pids = {p for p in pids if p != os.getpid()}
    # SIGSTOP all, then SIGKILL all: one by one, a raylet would see its agent die first
    # and unregister gracefully, which a host losing power never does
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        live = _proc_table()  # zombies count as gone: their parent (init) reaps them
        pids = {p for p in pids if p in live}
        if pids:
            time.sleep(0.05)


def kill_ray_tree(temp_root: Path, sessions: Iterable[int] = ()) -> None:
    """SIGKILL every process of the given sessions or naming `temp_root`, and descendants."""
    table = _proc_table()
    marker = f"{temp_root}/"
    sessions = set(sessions)
    # "ray" in the command line too: a recorded session id of a long-dead test may since
    # have been reused by an unrelated process (every Ray process names ray somewhere)
    doomed = {p for p, (_, sid, cmd) in table.items()
              if marker in cmd or (sid in sessions and "ray" in cmd)}
    while extra := {p for p, (ppid, _, _) in table.items() if ppid in doomed} - doomed:
        doomed |= extra  # and their descendants (a worker that called setsid)
    _kill_and_wait(doomed)
