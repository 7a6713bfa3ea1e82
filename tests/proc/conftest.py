"""tests/proc: real engine processes. Shared helpers live in procutil.py."""

from __future__ import annotations

import multiprocessing
import os

import pytest

# Set before any engine process is spawned: spawned children inherit the environment,
# and one thread per process keeps a 2-core machine from oversubscribing.
os.environ["OMP_NUM_THREADS"] = "1"


@pytest.fixture(autouse=True)
def no_leaked_children():
    """Every test must leave no engine process behind (active_children() also reaps).

    Only processes the test started count: servers of other test directories (session
    fixtures) may legitimately be running alongside.
    """
    before = {p.pid for p in multiprocessing.active_children()}
    yield
    leaked = [p for p in multiprocessing.active_children()
              if p.name.startswith("omni-") and p.pid not in before]
    for process in leaked:  # clean up so one leak does not fail every later test
        process.kill()
        process.join(5)
    assert not leaked, f"engine processes left running: {leaked}"
