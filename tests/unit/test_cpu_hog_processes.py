"""bench/cpu_hog.py: the hogs run at the given process's niceness, are killed and reaped
when the block ends, and end by themselves when their parent dies without stopping them
(a test killed by its timeout leaves no busy loop behind)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from bench.cpu_hog import CpuHog
from omni.runtime.liveness import process_state


def test_hogs_spin_at_the_niceness_given_and_are_reaped_after():
    niced = subprocess.Popen([sys.executable, "-c", "import os, time; os.nice(3); "
                              "time.sleep(30)"])
    try:
        time.sleep(0.3)  # it has niced itself
        with CpuHog(2, like_pid=niced.pid) as hog:
            pids = [p.pid for p in hog.procs]
            # alive: running, or briefly asleep / in disk wait while it starts (a CI run
            # once caught one in D while its interpreter was still being read in)
            assert all(process_state(pid) in ("R", "S", "D") for pid in pids)
            assert all(os.getpriority(os.PRIO_PROCESS, pid) ==
                       os.getpriority(os.PRIO_PROCESS, niced.pid) for pid in pids)
        assert all(process_state(pid) is None for pid in pids)
        assert hog.summary()["processes"] == 2 and hog.summary()["seconds"] >= 0
    finally:
        niced.kill()
        niced.wait()


def test_hogs_end_with_their_parent():
    parent = subprocess.run(
        [sys.executable, "-c", "import os; from bench.cpu_hog import CpuHog; "
         "print(*(p.pid for p in CpuHog(2).start().procs), flush=True); os._exit(0)"],
        capture_output=True, text=True, timeout=60, env={**os.environ,
                                                          "PYTHONPATH": os.getcwd()})
    pids = [int(pid) for pid in parent.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 10
    while any(process_state(pid) not in (None, "Z") for pid in pids):
        assert time.monotonic() < deadline, "a hog outlived its parent"
        time.sleep(0.05)
