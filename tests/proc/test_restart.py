"""A stage with `restart: true` gets a new process when a replica dies; its requests fail
with a typed error, health dips and recovers, and later requests are served again."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from procutil import Tap, assert_idle, chunk_outputs, collect, run, serving, wait_until

from omni.config.pipeline import parse_pipeline
from omni.errors import ReplicaDeadError


def restarting_pipeline():
    return parse_pipeline({"name": "phoenix", "stages": [
        {"name": "s", "engine": "echo", "final_output": "text", "restart": True,
         "options": {"delay_ms": 50}}]})


def test_killed_replica_is_restarted_and_serves_again():
    async def body():
        async with serving(restarting_pipeline()) as omni:
            tap = Tap(omni)
            replica = omni.orchestrator.engines.replicas["s/0"]
            old_pid = replica.process.pid
            task = asyncio.create_task(collect(omni.generate(
                {"prompt": "doomed"}, request_id="d", params={"*": {"chunks": 20}})))
            await tap.first(lambda r: r.request_id == "d")
            os.kill(old_pid, signal.SIGKILL)
            with pytest.raises(ReplicaDeadError):
                await task
            await wait_until(lambda: omni.health()["healthy"], 8.0, "the restarted replica")
            assert replica.process.pid != old_pid and replica.restarts == 1
            assert omni.health()["stages"]["s"]["restarts"] == 1
            outputs = await collect(omni.generate({"prompt": "reborn"}))
            assert "".join(o.data["text"] for o in chunk_outputs(outputs)) == "reborn"
            assert_idle(omni)
    run(body(), timeout_s=20)


def test_crash_inside_a_request_restarts_too():
    async def body():
        async with serving(restarting_pipeline()) as omni:
            with pytest.raises(ReplicaDeadError, match="code 17"):
                await collect(omni.generate({"prompt": "x"}, params={"*": {"echo_fail": "crash"}}))
            await wait_until(lambda: omni.health()["healthy"], 8.0, "the restarted replica")
            outputs = await collect(omni.generate({"prompt": "fine"}))
            assert outputs[-1].finished
    run(body(), timeout_s=20)


class _DelayRecorder:
    """Stands in for the engine group's event loop: records the delay of every scheduled
    restart (the delay the launcher actually uses), delegates everything else."""

    def __init__(self, loop):
        self._loop = loop
        self.restart_delays: list[float] = []

    def call_later(self, delay, callback, *args, **kwargs):
        if getattr(callback, "__name__", "") == "_restart":
            self.restart_delays.append(delay)
        return self._loop.call_later(delay, callback, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._loop, name)


@pytest.mark.parametrize("stable_s, delays, streak", [(0.2, [0.0, 0.0], 1),
                                                      (60.0, [0.0, 1.0], 2)])
def test_backoff_starts_over_after_a_replica_stayed_up(stable_s, delays, streak, monkeypatch):
    """The restart delay follows the crash streak, not the lifetime count: a replica that
    stayed up STABLE_UP_S before dying again restarts at once (streak back to 1), one that
    did not waits the next backoff step. Checks the delay the launcher schedules."""
    from omni.runtime import restarts

    monkeypatch.setattr(restarts, "STABLE_UP_S", stable_s)
    assert restarts.RESTART_BACKOFF_S[:2] == (0.0, 1.0)

    async def body():
        async with serving(restarting_pipeline()) as omni:
            engines = omni.orchestrator.engines
            recorder = engines.loop = _DelayRecorder(engines.loop)
            replica = engines.replicas["s/0"]
            for _ in range(2):
                old_pid = replica.process.pid
                os.kill(old_pid, signal.SIGKILL)
                await wait_until(lambda old=old_pid: omni.health()["healthy"]
                                 and replica.process.pid != old, 8.0, "a restart")
                await asyncio.sleep(0.4)  # up longer than 0.2 s, shorter than 60 s
            assert recorder.restart_delays == delays, (
                f"restart delays {recorder.restart_delays}, expected {delays} "
                f"(STABLE_UP_S={stable_s})")
            assert replica.restarts == 2 and replica.crash_streak == streak
    run(body(), timeout_s=30)
