"""Abort (explicit, cancellation, leaving the loop) and deadlines, at every stage of a
chain of real engine processes; nothing is left behind, in the orchestrator or in the
engines, and the pipeline keeps serving."""

from __future__ import annotations

import asyncio
import time

import pytest
from procutil import (
    Tap,
    assert_idle,
    chunk_outputs,
    collect,
    echo_stage,
    make_pipeline,
    run,
    serving,
    single_pipeline,
    wait_until,
)

from omni.errors import DeadlineExceededError, RequestAbortedError

STEP_MS = 20
SLOW = {"*": {"chunks": 40}}  # 40 steps x 20 ms: ~0.8 s at every stage


def chain():
    return make_pipeline("chain", [
        echo_stage("a", delay_ms=STEP_MS),
        echo_stage("b", delay_ms=STEP_MS),
        echo_stage("c", delay_ms=STEP_MS, final="text"),
    ], [("a", "b"), ("b", "c")])


async def _still_serving_and_engines_forgot(omni, tap: Tap) -> None:
    """A following request succeeds, and every engine that runs it reports it as its only
    running job: the aborted request was dropped by the engines too, not just ignored."""
    outputs = await collect(omni.generate({"prompt": "after"}, request_id="next",
                                          params={"*": {"chunks": 2}}))
    assert "".join(o.data["text"] for o in chunk_outputs(outputs)) == "after"
    assert outputs[-1].finished
    rows = tap.of("next")
    assert {r.stage for r in rows} == {"a", "b", "c"}
    assert [r.stats["running"] for r in rows if not r.finished] == [1, 1, 1], rows
    assert_idle(omni)


@pytest.mark.parametrize("how", ["abort", "cancel"])
@pytest.mark.parametrize("stage", ["a", "b", "c"])
def test_abort_mid_flight_at_each_stage(stage: str, how: str):
    async def body():
        async with serving(chain()) as omni:
            tap = Tap(omni)
            task = asyncio.create_task(collect(omni.generate(
                {"prompt": "abort me " * 5}, request_id="victim", params={stage: SLOW["*"]})))
            # the victim has produced its first chunk at `stage` and has 39 to go there
            await tap.first(lambda r: r.request_id == "victim" and r.stage == stage)
            state = omni.orchestrator.requests["victim"]
            assert stage not in state.done
            assert state.engine_id in state.bound[stage].outstanding
            if how == "abort":
                assert await omni.abort("victim") is True
                with pytest.raises(RequestAbortedError):
                    await task
            else:
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            assert_idle(omni)
            assert await omni.abort("victim") is False  # no longer in flight
            assert omni.health()["healthy"]
            await _still_serving_and_engines_forgot(omni, tap)
    run(body())


def test_leaving_the_loop_early_aborts_the_request():
    async def body():
        async with serving(chain()) as omni:
            tap = Tap(omni)
            seen = []
            async for out in omni.generate({"prompt": "x" * 40}, request_id="victim",
                                           params={"c": SLOW["*"]}):
                seen.append(out)
                break  # the generator is finalized (and the request aborted) by asyncio
            assert seen[0].stage == "c" and seen[0].data["index"] == 0
            await wait_until(lambda: not omni.orchestrator.requests, 2.0, "abort on break")
            assert_idle(omni)
            await _still_serving_and_engines_forgot(omni, tap)
    run(body())


def test_deadline_exceeded_frees_everything():
    async def body():
        async with serving(chain()) as omni:
            tap = Tap(omni)
            started = time.monotonic()
            with pytest.raises(DeadlineExceededError, match="0.2"):
                await collect(omni.generate({"prompt": "slow"}, request_id="late",
                                            params=SLOW, timeout_s=0.2))
            elapsed = time.monotonic() - started
            assert 0.2 <= elapsed < 0.7, elapsed
            assert_idle(omni)
            await _still_serving_and_engines_forgot(omni, tap)
    run(body())


def test_pipeline_default_deadline_applies():
    async def body():
        async with serving(single_pipeline(delay_ms=STEP_MS, request_timeout_s=0.3)) as omni:
            started = time.monotonic()
            with pytest.raises(DeadlineExceededError):
                await collect(omni.generate({"prompt": "slow"}, params=SLOW))
            assert 0.3 <= time.monotonic() - started < 0.8
            assert_idle(omni)
            # a request that fits in the deadline is unaffected
            outputs = await collect(omni.generate({"prompt": "quick"}))
            assert outputs[-1].finished
    run(body())


def test_reused_request_id_gets_no_stale_outputs_from_aborted_run():
    async def body():
        async with serving(single_pipeline(delay_ms=250)) as omni:
            agen = omni.generate({"prompt": "old-old-old-old"}, request_id="same",
                                 params={"*": {"chunks": 10}})
            first = await agen.__anext__()
            assert first.data["text"] == "ol"
            await omni.abort("same")
            with pytest.raises(RequestAbortedError):
                await agen.__anext__()
            # the engine is mid-step for the old run: its next chunk is already coming
            outputs = await collect(omni.generate({"prompt": "NEW"}, request_id="same"))
            assert [o.data for o in chunk_outputs(outputs)] == [
                {"text": "NEW", "trace": ["s"], "index": 0}]
    run(body())
