"""Failures with real engine processes: a request failing at one stage, a replica dying
(crash inside a step, kill -9), a pool surviving the loss of one replica, and a stage
that cannot load failing the start fast and cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import time

import pytest
from procutil import (
    ENGINE_LOG_LEVEL,
    Tap,
    assert_idle,
    assert_stopped,
    chunk_outputs,
    collect,
    dag_pipeline,
    echo_stage,
    make_pipeline,
    replicas_of,
    run,
    serving,
    single_pipeline,
    wait_until,
)

from omni import AsyncOmni
from omni.errors import (
    ReplicaDeadError,
    RequestFailedError,
    StageUnavailableError,
)
from omni.runtime.launcher import StartupError

PROMPT = "the quick brown fox"


async def _ok(omni, modalities, chunks=3, **kwargs):
    outputs = await collect(omni.generate({"prompt": PROMPT}, modalities=modalities,
                                          params={"*": {"chunks": chunks}}, **kwargs))
    assert outputs[-1].finished
    for stage in {o.stage for o in chunk_outputs(outputs)}:
        assert "".join(o.data["text"] for o in chunk_outputs(outputs, stage)) == PROMPT
    return outputs


# -- a request fails, the others do not --------------------------------------------------


def test_step_failure_fails_only_that_request_naming_its_stage():
    async def body():
        async with serving(dag_pipeline({s: {"delay_ms": 10} for s in "abc"})) as omni:
            bad = omni.generate({"prompt": PROMPT}, modalities=["text", "audio"],
                                params={"*": {"chunks": 3, "echo_fail": "step",
                                              "echo_fail_stage": "b"}})
            results = await asyncio.gather(
                collect(bad), *(_ok(omni, m) for m in (["text"], ["audio"], ["text", "audio"],
                                                       ["text"])),
                return_exceptions=True)
            error = results[0]
            assert type(error) is RequestFailedError, repr(error)  # not a replica death
            assert error.stage == "b"
            assert "stage 'b'" in str(error) and "injected failure" in str(error)
            for result in results[1:]:
                assert not isinstance(result, BaseException), repr(result)
            assert omni.health()["healthy"]
            assert_idle(omni)
            await _ok(omni, ["text"])
    run(body())


def test_bad_request_params_fail_the_request_at_that_stage():
    async def body():
        async with serving(dag_pipeline()) as omni:
            with pytest.raises(RequestFailedError, match="many") as info:
                await collect(omni.generate({"prompt": PROMPT}, params={"b": {"chunks": "many"}}))
            assert info.value.stage == "b"
            assert omni.health()["healthy"]
            assert_idle(omni)
            await _ok(omni, ["text"])
    run(body())


def test_an_internal_error_on_outputs_fails_that_request_and_frees_it(monkeypatch):
    """A bug while the orchestrator handles a stage's output (injected here) fails that
    request with the reason, frees it everywhere, and leaves the others alone: before,
    the message was dropped and the request waited forever."""
    from omni.runtime.orchestrator import Orchestrator

    handle = Orchestrator._on_stage_output

    def broken(self, state, stage, *args):
        if state.inputs.get("prompt") == "boom" and stage == "b":
            raise KeyError("injected")
        return handle(self, state, stage, *args)

    monkeypatch.setattr(Orchestrator, "_on_stage_output", broken)

    async def body():
        async with serving(dag_pipeline()) as omni:
            bad = collect(omni.generate({"prompt": "boom"}, params={"*": {"chunks": 3}}))
            results = await asyncio.gather(bad, _ok(omni, ["text"]), return_exceptions=True)
            assert type(results[0]) is RequestFailedError, repr(results[0])
            assert results[0].stage == "b" and "internal error" in str(results[0])
            assert "KeyError" in str(results[0])
            assert not isinstance(results[1], BaseException), repr(results[1])
            assert omni.health()["healthy"]
            assert_idle(omni)
    run(body())


# -- a replica dies ----------------------------------------------------------------------


def test_crash_in_step_fails_in_flight_request_and_nothing_else():
    async def body():
        pipeline = dag_pipeline({"side": {"delay_ms": 20}})
        async with serving(pipeline) as omni, serving(single_pipeline("other", delay_ms=20)) \
                as other:
            b = omni.orchestrator.engines.pools["b"].replicas[0]
            # in flight on other stages / another pipeline while b crashes: ~10 x 20 ms
            bystanders = [asyncio.create_task(_ok(omni, ["audio"], chunks=10)),
                          asyncio.create_task(_ok(other, None, chunks=10))]
            started = time.monotonic()
            with pytest.raises(ReplicaDeadError) as info:
                await collect(omni.generate({"prompt": PROMPT}, params={
                    "*": {"echo_fail": "crash", "echo_fail_stage": "b"}}))
            assert time.monotonic() - started < 1.0
            assert info.value.stage == "b"
            assert "b/0" in str(info.value) and "exited with code 17" in str(info.value)
            await asyncio.gather(*bystanders)  # unaffected
            assert b.process.exitcode == 17 and not b.alive

            health = omni.health()
            assert health["healthy"] is False
            assert health["stages"]["b"] == {"live": 0, "replicas": 1, "restarts": 0}
            assert all(health["stages"][s]["live"] == 1 for s in ("a", "c", "side"))
            assert other.health()["healthy"] is True
            assert_idle(omni)
            # a route through b cannot be served; a route around it still is
            with pytest.raises(StageUnavailableError, match="'b'"):
                await collect(omni.generate({"prompt": PROMPT}, modalities=["text"]))
            await _ok(omni, ["audio"])
            await _ok(other, None)
            assert_idle(omni)
    run(body())


@pytest.mark.parametrize("stage", ["a", "c"])
def test_sigkill_of_a_replica_fails_its_request_fast(stage: str):
    async def body():
        async with serving(dag_pipeline({s: {"delay_ms": 20} for s in "abc"})) as omni:
            tap = Tap(omni)
            victim = asyncio.create_task(collect(omni.generate(
                {"prompt": PROMPT}, request_id="victim", params={stage: {"chunks": 40}})))
            await tap.first(lambda r: r.request_id == "victim" and r.stage == stage)
            replica = omni.orchestrator.engines.pools[stage].replicas[0]
            started = time.monotonic()
            os.kill(replica.process.pid, signal.SIGKILL)
            with pytest.raises(ReplicaDeadError) as info:
                await victim
            assert time.monotonic() - started < 1.0
            assert info.value.stage == stage and "SIGKILL" in str(info.value)
            assert replica.process.exitcode == -signal.SIGKILL
            assert omni.health()["healthy"] is False
            assert omni.health()["stages"][stage]["live"] == 0
            assert_idle(omni)
            if stage == "c":  # a and side still live: the audio route still works
                await _ok(omni, ["audio"])
    run(body())


def test_pool_keeps_serving_after_losing_one_of_two_replicas():
    async def body():
        async with serving(single_pipeline(replicas=2, delay_ms=20)) as omni:
            tap = Tap(omni)
            slow = {"*": {"chunks": 40}}
            first = asyncio.create_task(collect(omni.generate(
                {"prompt": PROMPT}, request_id="r1", params=slow)))
            second = asyncio.create_task(collect(omni.generate(
                {"prompt": PROMPT}, request_id="r2", params=slow)))
            await tap.first(lambda r: r.request_id == "r1")
            await tap.first(lambda r: r.request_id == "r2")
            states = omni.orchestrator.requests
            doomed, survivor = states["r1"].bound["s"], states["r2"].bound["s"]
            assert doomed is not survivor  # least-outstanding spread them

            os.kill(doomed.process.pid, signal.SIGKILL)
            with pytest.raises(ReplicaDeadError):
                await first
            outputs = await second  # bound to the other replica: unaffected
            assert "".join(o.data["text"] for o in chunk_outputs(outputs)) == PROMPT

            health = omni.health()
            assert health["healthy"] is True
            assert health["stages"]["s"] == {"live": 1, "replicas": 2, "restarts": 0}
            assert omni.orchestrator.engines.pools["s"].live() == [survivor]
            results = await asyncio.gather(*(_ok(omni, None, request_id=f"n{i}")
                                             for i in range(4)))
            assert len(results) == 4
            assert {r.replica_id for i in range(4) for r in tap.of(f"n{i}")} == \
                {survivor.replica_id}
            assert_idle(omni)
    run(body())


# -- startup failure ---------------------------------------------------------------------


def _boom_pipeline(ok_replicas: int = 2):
    return make_pipeline("boomer", [
        echo_stage("loader", fail_load="boom"),
        echo_stage("slowpoke", final="text", replicas=ok_replicas, delay_ms=5000),
    ], [("loader", "slowpoke")])


def _assert_no_children(omni: AsyncOmni) -> None:
    assert_stopped(omni)
    pids = [r.process.pid for r in replicas_of(omni)]
    assert not [p for p in multiprocessing.active_children() if p.pid in pids]
    assert not [pid for pid in pids if os.path.exists(f"/proc/{pid}")]


def test_load_failure_fails_start_with_its_message_and_leaves_nothing():
    async def body():
        omni = AsyncOmni(_boom_pipeline(), log_level=ENGINE_LOG_LEVEL)
        group = omni.orchestrator.engines
        start = asyncio.create_task(omni.start())
        await wait_until(lambda: "loader" in group.pools and group.pools["loader"].replicas
                         and group.pools["loader"].replicas[0].process is not None, 3.0,
                         "start() to spawn the loader")
        loader = group.pools["loader"].replicas[0]
        # Hold the failing stage until its siblings are ready, so the failure is the
        # only thing this test measures (the other order, a failure while a sibling is
        # still loading: test_load_failure_is_fast_while_a_sibling_is_still_loading).
        with contextlib.suppress(ProcessLookupError):  # (gone already: see below)
            os.kill(loader.process.pid, signal.SIGSTOP)
        await wait_until(lambda: "slowpoke" in group.pools, 3.0, "start() to spawn replicas")
        ready = asyncio.gather(*(r.ready for r in group.pools["slowpoke"].replicas))
        await asyncio.wait({ready, start}, return_when=asyncio.FIRST_COMPLETED)
        if start.done():  # it failed before the stop took (a loaded machine: twice in a
            # session beside other runs): the premise is gone, the other order's test covers it
            ready.cancel()
            with contextlib.suppress(ProcessLookupError):
                os.kill(loader.process.pid, signal.SIGCONT)
            with contextlib.suppress(StartupError):
                await start
            pytest.skip("the loader failed before it could be held")
        os.kill(loader.process.pid, signal.SIGCONT)
        # timed from the loader's death: the rest of its own start-up after SIGCONT (~1.4 s
        # here alone, 3.1 s once under a loaded CI run) is not what this test measures
        await asyncio.wait_for(asyncio.shield(group._exits[loader.replica_id]), 30)
        started = time.monotonic()
        with pytest.raises(StartupError) as info:
            await start
        assert time.monotonic() - started < 3.0
        message = str(info.value)
        assert "boom" in message and "'loader'" in message
        assert "EngineLoadError" in message
        assert loader.process.exitcode == 1
        assert all(r.process.exitcode == 0 for r in group.pools["slowpoke"].replicas)
        _assert_no_children(omni)
        assert not omni.health()["healthy"]
    run(body())


def test_load_failure_message_without_orchestration():
    """The plain path, whatever the order the replicas come up in."""
    async def body():
        omni = AsyncOmni(_boom_pipeline(ok_replicas=1), log_level=ENGINE_LOG_LEVEL)
        with pytest.raises(StartupError, match=r"stage 'loader' failed to start.*boom"):
            await omni.start()
        _assert_no_children(omni)
    run(body(), timeout_s=12)


def test_load_failure_is_fast_while_a_sibling_is_still_loading():
    async def body():
        omni = AsyncOmni(_boom_pipeline(ok_replicas=1), log_level=ENGINE_LOG_LEVEL)
        group = omni.orchestrator.engines
        start = asyncio.create_task(omni.start())
        await wait_until(lambda: "slowpoke" in group.pools, 3.0, "start() to spawn replicas")
        sibling = group.pools["slowpoke"].replicas[0]
        loader = group.pools["loader"].replicas[0]
        # the sibling "loads slowly": paused until the failing stage has died
        os.kill(sibling.process.pid, signal.SIGSTOP)
        try:
            await asyncio.wait_for(asyncio.shield(group._exits[loader.replica_id]), 5)
        finally:
            os.kill(sibling.process.pid, signal.SIGCONT)
        started = time.monotonic()
        with pytest.raises(StartupError, match="boom"):
            await start
        _assert_no_children(omni)
        assert time.monotonic() - started < 3.0
    run(body(), timeout_s=15)


def test_stage_nice_lowers_only_that_stage_and_a_bad_value_fails_its_load():
    """`nice`: the stage's engine process yields the CPU (the omni preset's thinker)."""
    async def body():
        pipeline = make_pipeline("prio", [echo_stage("low", nice=7),
                                          echo_stage("out", final="text")], [("low", "out")])
        async with serving(pipeline) as omni:
            group = omni.orchestrator.engines
            base = os.getpriority(os.PRIO_PROCESS, 0)
            low, out = (group.pools[s].replicas[0].process.pid for s in ("low", "out"))
            assert os.getpriority(os.PRIO_PROCESS, low) == min(19, base + 7)
            assert os.getpriority(os.PRIO_PROCESS, out) == base
        bad = make_pipeline("prio", [echo_stage("low", final="text", nice="high")])
        omni = AsyncOmni(bad, log_level=ENGINE_LOG_LEVEL)
        with pytest.raises(StartupError, match=r"nice must be an integer from 0 to 19"):
            await omni.start()
        _assert_no_children(omni)
        bad = make_pipeline("frozen", [echo_stage("out", final="text", gc_freeze=1)])
        omni = AsyncOmni(bad, log_level=ENGINE_LOG_LEVEL)
        with pytest.raises(StartupError, match=r"gc_freeze must be true or false"):
            await omni.start()
        _assert_no_children(omni)
    run(body(), timeout_s=30)
