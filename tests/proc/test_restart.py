"""A stage with `restart: true` gets a new process when a replica dies; its requests fail
with a typed error, health dips and recovers, and later requests are served again."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

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


def _drop_heartbeats(group) -> None:
    """As if every heartbeat thread were starved: the group never sees a heartbeat."""
    from_unknown = group._from_unknown
    group._from_unknown = lambda identity, message: (
        None if identity.endswith(b"#hb") else from_unknown(identity, message))


def test_late_heartbeats_of_a_running_replica_are_no_death_and_a_stopped_one_is(caplog):
    """Liveness (omni/runtime/liveness.py) end to end: no heartbeat reaches the
    orchestrator for 10 intervals, yet the replica's process is alive, so it keeps its
    requests (a slow-heartbeat warning instead of a death); stopped (SIGSTOP), it is
    declared dead at the next check after two missed intervals, as before, and restarted."""
    caplog.set_level(logging.WARNING, logger="omni.runtime.launcher")
    pipeline = parse_pipeline({"name": "phoenix", "heartbeat_s": 0.2, "stages": [
        {"name": "s", "engine": "echo", "final_output": "text", "restart": True,
         "options": {"delay_ms": 50}}]})

    async def body():
        async with serving(pipeline) as omni:
            group = omni.orchestrator.engines
            replica = group.replicas["s/0"]
            _drop_heartbeats(group)
            slow = asyncio.create_task(collect(omni.generate(
                {"prompt": "patience"}, params={"*": {"chunks": 40}})))  # 2 s
            outputs = await slow
            assert "".join(o.data["text"] for o in chunk_outputs(outputs)) == "patience"
            assert replica.alive and replica.restarts == 0
            assert group.heartbeats.slow.count >= 3
            old_pid = replica.process.pid
            doomed = asyncio.create_task(collect(omni.generate(
                {"prompt": "doomed"}, params={"*": {"chunks": 40}})))
            await asyncio.sleep(0.1)
            os.kill(old_pid, signal.SIGSTOP)
            stopped_at = time.monotonic()
            with pytest.raises(ReplicaDeadError, match=r"no heartbeat .* is stopped"):
                await doomed
            assert time.monotonic() - stopped_at < 1.0  # the next check: 0.2 s apart
            await wait_until(lambda: omni.health()["healthy"], 8.0, "the restarted replica")
            assert replica.process.pid != old_pid and replica.restarts == 1
            assert_idle(omni)
    run(body(), timeout_s=30)
    warnings = [r.getMessage() for r in caplog.records if "slow heartbeat" in r.getMessage()]
    assert len(warnings) == 1 and "replica s/0" in warnings[0], warnings
