"""A CPU hog: N busy-looping processes beside a server, to load the machine several times
over its cores the way other programs do (issue 43: replicas were declared dead at a load
of 6 on 2 cores). Used by `bench soak --cpu-hog N` and tests/e2e/test_cpu_hog.py.

Each hog runs at the niceness of the process it is set beside (the server's): equal,
not lower, so the kernel gives the server's threads no edge. Each is a child of the
caller in its session: where the kernel groups CPU time by session (autogroup, on by
default on many distributions) a hog in a session of its own would compete as one group
and load the server far less than its count says. A hog ends when its parent does (it
looks every few milliseconds), so a killed test or bench leaves none behind; `stop`
(and leaving the `with` block) kills and reaps them at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

# spin; every ~5 ms of spinning, leave if the parent (its pid given: it may be gone
# before the hog first looks) is gone, the hog reparented
HOG = """
import os, sys
parent = int(sys.argv[1])
while os.getppid() == parent:
    for _ in range(100_000):
        pass
"""


class CpuHog:
    """``with CpuHog(8, like_pid=server.pid) as hog: ...``; ``hog.summary()`` after."""

    def __init__(self, processes: int, like_pid: int | None = None) -> None:
        self.processes = processes
        self.like_pid = like_pid
        self.procs: list[subprocess.Popen] = []
        self.started = self.stopped = 0.0
        self.nice = 0  # the hogs', read from like_pid at start (it may be gone at the end)
        self.load_before: tuple[float, ...] = ()
        self.load_after: tuple[float, ...] = ()

    def start(self) -> CpuHog:
        self.nice = nice = os.getpriority(os.PRIO_PROCESS, self.like_pid or 0)
        self.load_before = os.getloadavg()
        self.started = time.monotonic()
        for _ in range(self.processes):
            proc = subprocess.Popen([sys.executable, "-c", HOG, str(os.getpid())],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            self.procs.append(proc)
            if os.getpriority(os.PRIO_PROCESS, proc.pid) < nice:
                os.setpriority(os.PRIO_PROCESS, proc.pid, nice)  # only ever higher: allowed
        return self

    def stop(self) -> None:
        if self.procs and not self.stopped:
            self.stopped = time.monotonic()
            self.load_after = os.getloadavg()
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for proc in self.procs:
            proc.wait(30)

    def __enter__(self) -> CpuHog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def summary(self) -> dict[str, Any]:
        return {"processes": self.processes, "cores": os.cpu_count(),
                "seconds": round((self.stopped or time.monotonic()) - self.started, 1),
                "nice": self.nice,
                "loadavg_before": [round(x, 2) for x in self.load_before],
                "loadavg_after": [round(x, 2) for x in self.load_after]}


class ServerLog(list):
    """A server's log lines as they come (start_server's ``log``): the last ``keep`` of
    them, and counts over the whole run of the lines liveness is judged by."""

    PATTERNS = {"deaths": " is down: ", "slow_heartbeats": "slow heartbeat: ",
                "restarts": "restarting replica "}

    def __init__(self, keep: int = 400) -> None:
        super().__init__()
        self.keep = keep
        self.counts = dict.fromkeys(self.PATTERNS, 0)
        self.deaths: list[str] = []  # every "replica X is down: why" line

    def append(self, line: str) -> None:
        for key, pattern in self.PATTERNS.items():
            if pattern in line:
                self.counts[key] += 1
                if key == "deaths":
                    self.deaths.append(line.strip())
        super().append(line)
        if len(self) > 2 * self.keep:
            del self[:-self.keep]
