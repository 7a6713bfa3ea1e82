"""Busy or gone (omni/runtime/liveness.py, heartbeats.py), with real processes: a late
heartbeat from a local process that is runnable (it holds the GIL, its heartbeat thread
starves) or asleep is no death; a stopped one (SIGSTOP) is declared dead at the next
check, an exited one too, and one silent past hang_timeout_s is hung. A remote replica
is judged by its link: while its Python is starved its libzmq I/O thread still answers
ZMTP heartbeats, and a stopped one's connection is closed within two intervals."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from omni.engines.proc.channel import Channel
from omni.runtime.control import ControlRouter
from omni.runtime.heartbeats import HeartbeatWatch
from omni.runtime.liveness import local_gone, probe, process_state
from omni.runtime.pool import Replica
from omni.wire.protocol import HEARTBEAT_SUFFIX, decode

INTERVAL_S = 0.05
# holds the GIL for the seconds given on stdin: Python threads of this process (its
# heartbeat) cannot run, the process is runnable (state R), libzmq's threads run
HOLD_GIL = """
import sys, time
sys.setswitchinterval(1000)  # another thread asks for the GIL only after this long
print("holding", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    pass
"""


def _child(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                            stdin=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})


def _end(child: subprocess.Popen) -> None:
    child.send_signal(signal.SIGCONT)
    child.kill()
    child.wait(10)


@pytest.fixture
def busy():
    child = _child(HOLD_GIL, "30")
    assert child.stdout.readline().strip() == "holding"
    yield child
    _end(child)


def test_process_states(busy):
    assert process_state(busy.pid) in ("R", "S")  # on a crowded machine it may wait for a CPU
    assert local_gone(busy.pid) is None
    os.kill(busy.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while process_state(busy.pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "is stopped (state T" in local_gone(busy.pid)
    busy.kill()
    while process_state(busy.pid) not in ("Z", None) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "has exited" in local_gone(busy.pid)  # a zombie, not reaped yet
    busy.wait(10)
    assert process_state(busy.pid) is None and "has exited" in local_gone(busy.pid)


def _watch(replica: Replica, deaths: list[str], hang_s: float = 0.0) -> HeartbeatWatch:
    def on_silent(replica: Replica, reason: str) -> None:
        replica.alive = False
        deaths.append(reason)
    return HeartbeatWatch(INTERVAL_S, {replica.replica_id: replica}, lambda: None, on_silent,
                          lambda r: probe(r, None, local=True), hang_s)


async def _until(condition, timeout_s: float) -> float:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, "timed out"
        await asyncio.sleep(0.005)
    return time.monotonic() - start


def test_a_runnable_local_process_is_busy_and_a_stopped_one_dead(busy, caplog):
    caplog.set_level(logging.WARNING, logger="omni.runtime.launcher")
    deaths: list[str] = []

    async def body():
        loop = asyncio.get_running_loop()
        replica = Replica("tts/0", "tts", 0, busy, loop.create_future(), alive=True,
                          last_heartbeat=time.monotonic())  # and never again
        watch = _watch(replica, deaths)
        watch.start(loop)
        await asyncio.sleep(20 * INTERVAL_S)  # silent for 10 times the two intervals
        assert deaths == [] and replica.alive
        assert watch.slow.count >= 10
        os.kill(busy.pid, signal.SIGSTOP)
        took = await _until(lambda: deaths, 2.0)
        watch.stop()
        assert took < 3 * INTERVAL_S + 0.5  # the next check or so, as before
        assert deaths[0].startswith("no heartbeat for ") and "is stopped" in deaths[0]
    asyncio.run(body())
    warnings = [r.getMessage() for r in caplog.records if "slow heartbeat" in r.getMessage()]
    assert len(warnings) == 1 and "tts/0" in warnings[0] and "alive" in warnings[0]


def test_an_exited_process_is_dead_and_a_live_silent_one_hung_after_its_timeout():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait(10)
    deaths: list[str] = []

    async def body():
        loop = asyncio.get_running_loop()
        sleeping = Replica("a/0", "a", 0, sleeper, loop.create_future(), alive=True,
                           last_heartbeat=time.monotonic())
        gone = Replica("b/0", "b", 0, exited, loop.create_future(), alive=True,
                       last_heartbeat=time.monotonic())
        watch = _watch(sleeping, deaths, hang_s=0.5)
        watch.replicas = {"a/0": sleeping, "b/0": gone}
        watch.start(loop)
        await _until(lambda: not gone.alive, 2.0)
        assert sleeping.alive and "has exited" in deaths[0]
        took = await _until(lambda: not sleeping.alive, 3.0)
        watch.stop()
        assert "hung" in deaths[1] and "hang_timeout_s" in deaths[1]
        assert took > 0.2  # not before its hang timeout (0.5 s of silence)
    try:
        asyncio.run(body())
    finally:
        _end(sleeper)


CHANNEL = """
import sys, time
from omni.engines.proc.channel import Channel
from omni.wire.protocol import Ready, encode, identity
channel = Channel(sys.argv[1], identity("s/0", 0), "s/0", heartbeat_s=float(sys.argv[2]))
channel.send(encode(Ready("s/0", {})))
for line in sys.stdin:  # a number: hold the GIL that long, as a starved engine would
    sys.setswitchinterval(1000)
    end = time.monotonic() + float(line)
    while time.monotonic() < end:
        pass
    sys.setswitchinterval(0.005)
"""


def test_a_remote_replica_is_judged_by_its_link_not_its_python():
    """tcp:// with ZMTP heartbeats on the router, as for replicas on other hosts."""
    beats: list[float] = []

    async def body():
        got_ready = asyncio.Event()

        def on_message(identity: bytes, message: bytes) -> None:
            if identity.endswith(HEARTBEAT_SUFFIX):
                beats.append(time.monotonic())
            elif decode(message):
                got_ready.set()
        router = ControlRouter("tcp://127.0.0.1:*", on_message, link_heartbeat_s=0.1)
        router.attach(asyncio.get_running_loop())
        child = _child(CHANNEL, router.address, "0.1")
        try:
            await asyncio.wait_for(got_ready.wait(), 30)
            await _until(lambda: len(beats) >= 2, 10)
            replica = Replica("s/0", "s", 0, None, asyncio.get_running_loop().create_future())
            child.stdin.write("2.0\n")
            child.stdin.flush()
            start, gaps = time.monotonic(), []
            while time.monotonic() - start < 2.5:  # its Python starved for 2 s
                gone, alive = probe(replica, router, local=False)
                assert gone is None and "answers" in alive
                gaps.append(time.monotonic() - beats[-1])
                await asyncio.sleep(0.05)
            assert max(gaps) > 1.0  # its heartbeats really stopped meanwhile
            child.send_signal(signal.SIGSTOP)
            took = await _until(lambda: probe(replica, router, local=False)[0], 3.0)
            assert took < 1.0  # a ping every 0.05 s, closed 0.15 s after an unanswered one
            assert "timed out" in probe(replica, router, local=False)[0]
        finally:
            _end(child)
            router.close()
    asyncio.run(body())


def test_a_link_probe_reaches_a_connected_heartbeat_socket_only(tmp_path):
    """The probes go to the engine's heartbeat socket (which discards them)."""
    seen: list[bytes] = []
    router = ControlRouter(f"ipc://{tmp_path}/c.sock", lambda who, m: seen.append(who))
    channel = Channel(router.address, b"s/0@0", "s/0", heartbeat_s=0.05)
    try:
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            router.drain()
            time.sleep(0.01)
        for _ in range(50):
            assert router.reaches(b"s/0@0#hb")
        assert not router.reaches(b"s/1@0#hb")
    finally:
        channel.close()
        router.close()


def test_the_settings_parse_and_the_flags_override():
    from omni.config.pipeline import ConfigError, parse_pipeline
    from omni.server import parse_args

    stages = [{"name": "s", "engine": "echo", "final_output": "text"}]
    default = parse_pipeline({"stages": stages})
    assert (default.heartbeat_s, default.hang_timeout_s) == (2.0, 60.0)
    assert parse_pipeline({"stages": stages, "hang_timeout_s": 0}).hang_timeout_s == 0.0
    for bad in (-1, "soon", True):
        with pytest.raises(ConfigError, match="hang_timeout_s"):
            parse_pipeline({"stages": stages, "hang_timeout_s": bad})
    args = parse_args(["--heartbeat-s", "0.5", "--hang-timeout-s", "0"])
    assert (args.heartbeat_s, args.hang_timeout_s) == (0.5, 0.0)
    assert parse_args([]).heartbeat_s is None  # the pipeline's own then
    for flag, value in (("--heartbeat-s", "0.01"), ("--hang-timeout-s", "-1")):
        with pytest.raises(SystemExit):
            parse_args([flag, value])
