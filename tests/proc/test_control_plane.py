"""The ZeroMQ control plane under stress: a stalled engine's queue, a replica on
tcp://127.0.0.1 started by hand and stopped with SIGSTOP (declared dead by heartbeat),
and a replica started again under a new incarnation while its predecessor's late
messages are ignored."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys

import pytest
import yaml
from procutil import (
    ENGINE_LOG_LEVEL,
    assert_idle,
    collect,
    echo_stage,
    make_pipeline,
    run,
    serving,
    wait_until,
)

from omni import AsyncOmni
from omni.config.pipeline import load_pipeline_file
from omni.errors import ReplicaDeadError
from omni.runtime.launcher import StartupError


def test_more_than_a_thousand_messages_to_a_stalled_engine_all_arrive():
    """1,200 ADDs sent while the engine is stopped (SIGSTOP) queue in the sockets; after
    SIGCONT every request finishes with its own text."""
    pipeline = make_pipeline("stall", [echo_stage("s", final="text")], max_inflight=2000,
                             heartbeat_s=0)

    async def body():
        async with serving(pipeline) as omni:
            pid = omni.orchestrator.engines.replicas["s/0"].process.pid
            os.kill(pid, signal.SIGSTOP)
            try:
                tasks = [asyncio.create_task(collect(omni.generate({"prompt": f"m{i}"})))
                         for i in range(1200)]
                await asyncio.sleep(0.3)  # the requests are sent and the engine still stopped
                assert not any(t.done() for t in tasks)
            finally:
                os.kill(pid, signal.SIGCONT)
            results = await asyncio.gather(*tasks)
            texts = ["".join(o.data["text"] for o in r if not o.finished) for r in results]
            assert texts == [f"m{i}" for i in range(1200)]
            assert_idle(omni)
    run(body(), timeout_s=60)


def _external_pipeline(tmp_path) -> str:
    path = tmp_path / "external.yaml"
    path.write_text(yaml.safe_dump({
        "name": "ext", "control_bind": "tcp://127.0.0.1:*", "heartbeat_s": 0.2,
        "stages": [{"name": "s", "engine": "echo", "launch": "external",
                    "final_output": "text", "options": {"delay_ms": 20}}]}))
    return str(path)


def _start_replica(address: str, pipeline: str, incarnation: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "omni.engines.proc", "--connect", address, "--pipeline",
         pipeline, "--stage", "s", "--incarnation", str(incarnation), "--log-level", "warning"],
        env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_a_stopped_tcp_replica_is_declared_dead_and_a_new_incarnation_takes_over(
        tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="omni.runtime.launcher")
    pipeline_file = _external_pipeline(tmp_path)
    omni = AsyncOmni(load_pipeline_file(pipeline_file), log_level=ENGINE_LOG_LEVEL)
    processes: list[subprocess.Popen] = []

    async def body():
        starting = asyncio.create_task(omni.start())
        group = omni.orchestrator.engines
        await wait_until(lambda: group.control_address, 10.0, "the ROUTER to bind")
        assert group.control_address.startswith("tcp://127.0.0.1:")
        processes.append(_start_replica(group.control_address, pipeline_file, 0))
        await asyncio.wait_for(starting, 60)
        outputs = await collect(omni.generate({"prompt": "over tcp"}))
        assert "".join(o.data["text"] for o in outputs if not o.finished) == "over tcp"

        slow = asyncio.create_task(collect(omni.generate(
            {"prompt": "never"}, params={"*": {"chunks": 50}})))
        await asyncio.sleep(0.1)
        processes[0].send_signal(signal.SIGSTOP)
        with pytest.raises(ReplicaDeadError, match="no heartbeat"):
            await asyncio.wait_for(slow, 10)
        assert not omni.health()["healthy"]

        processes.append(_start_replica(group.control_address, pipeline_file, 1))
        replica = group.replicas["s/0"]
        await asyncio.wait_for(asyncio.shield(replica.ready), 60)
        assert replica.identity == b"s/0@1" and replica.alive
        processes[0].send_signal(signal.SIGCONT)  # its late heartbeats and outputs: ignored
        outputs = await collect(omni.generate({"prompt": "the new one"}))
        assert "".join(o.data["text"] for o in outputs if not o.finished) == "the new one"
        await wait_until(lambda: any("not a current replica" in r.getMessage()
                                     and "s/0@0'" in r.getMessage() for r in caplog.records),
                         5.0, "the retired incarnation's messages to be ignored")
        assert omni.health()["healthy"]
        assert_idle(omni)
        await omni.close(drain_timeout_s=0)

    try:
        run(body(), timeout_s=120)
    finally:
        for process in processes:
            process.send_signal(signal.SIGCONT)
            process.kill()
            process.wait(10)


def test_a_control_address_in_use_fails_the_start_saying_so():
    """A second pipeline bound to the first one's tcp port: StartupError naming the
    address, no engine started, the first keeps serving."""
    first = make_pipeline("first", [echo_stage("s", final="text")],
                          control_bind="tcp://127.0.0.1:*")

    async def body():
        async with serving(first) as omni:
            taken = omni.orchestrator.engines.control_address
            second = AsyncOmni(make_pipeline("second", [echo_stage("s", final="text")],
                                             control_bind=taken), log_level=ENGINE_LOG_LEVEL)
            with pytest.raises(StartupError, match="cannot bind the control socket to tcp"):
                await second.start()
            assert all(r.process is None for r in second.orchestrator.engines.replicas.values())
            assert not os.path.exists(second.orchestrator.engines._ipc_dir)
            outputs = await collect(omni.generate({"prompt": "still mine"}))
            assert "".join(o.data["text"] for o in outputs if not o.finished) == "still mine"
    run(body())
