"""Admission, drain and stop, and the blocking `omni.Omni` wrapper, with real engine
processes."""

from __future__ import annotations

import asyncio
import textwrap
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
    replicas_of,
    run,
    serving,
    single_pipeline,
)

from omni import AsyncOmni, Omni
from omni.errors import AdmissionError, RequestAbortedError, ShuttingDownError

PROMPT = "drain me gently"


def _text(outputs) -> str:
    return "".join(o.data["text"] for o in chunk_outputs(outputs))


# -- admission ---------------------------------------------------------------------------


def test_max_inflight_refuses_the_third_request_then_admits_again():
    async def body():
        async with serving(single_pipeline(max_inflight=2, delay_ms=20)) as omni:
            slow = {"*": {"chunks": 10}}
            first = omni.generate({"prompt": PROMPT}, params=slow)
            second = omni.generate({"prompt": PROMPT}, params=slow)
            heads = [await first.__anext__(), await second.__anext__()]  # both admitted
            assert all(h.data["index"] == 0 for h in heads)
            assert omni.health()["in_flight"] == 2
            third = omni.generate({"prompt": PROMPT})
            with pytest.raises(AdmissionError, match="2 requests in flight"):
                await third.__anext__()
            assert len(omni.orchestrator.requests) == 2  # the refusal left no state
            rests = [await collect(first), await collect(second)]
            assert all(_text([h, *rest]) == PROMPT for h, rest in zip(heads, rests, strict=True))
            assert_idle(omni)
            # admitted again, up to the limit at once
            results = await asyncio.gather(*(collect(omni.generate({"prompt": PROMPT}))
                                             for _ in range(2)))
            assert all(_text(r) == PROMPT for r in results)
    run(body())


# -- drain and stop ----------------------------------------------------------------------


def test_close_drains_in_flight_request_before_stopping_engines():
    async def body():
        pipeline = dag_pipeline({s: {"delay_ms": 40} for s in ("a", "b", "c")})
        omni = await AsyncOmni(pipeline, log_level=ENGINE_LOG_LEVEL).start()
        tap = Tap(omni)
        request = asyncio.create_task(collect(omni.generate(
            {"prompt": PROMPT}, params={"*": {"chunks": 4}})))  # ~3 x 4 x 40 ms
        await tap.first(lambda r: r.stage == "a")  # in flight at the first stage
        closing = asyncio.create_task(omni.close(drain_timeout_s=5))
        await asyncio.sleep(0)
        # draining: new requests are refused while the old one runs to completion
        with pytest.raises(ShuttingDownError):
            await collect(omni.generate({"prompt": "late"}))
        assert omni.health()["healthy"] is False
        assert not request.done()
        await closing
        assert request.done()
        outputs = request.result()  # completed successfully, through every stage
        assert _text(outputs) == PROMPT and outputs[-1].finished
        assert set(outputs[-1].metrics["stages"]) == {"a", "b", "c"}
        assert_stopped(omni)
        assert all(r.process.exitcode == 0 for r in replicas_of(omni))  # clean SHUTDOWN
        with pytest.raises(ShuttingDownError):
            await collect(omni.generate({"prompt": "after"}))
        await omni.close()  # idempotent
    run(body())


def test_close_aborts_what_outlives_the_drain_timeout():
    async def body():
        omni = await AsyncOmni(single_pipeline(delay_ms=50),
                               log_level=ENGINE_LOG_LEVEL).start()
        tap = Tap(omni)
        request = asyncio.create_task(collect(omni.generate(
            {"prompt": PROMPT}, params={"*": {"chunks": 100}})))  # ~5 s
        await tap.first(lambda r: r.stage == "s")
        started = time.monotonic()
        await omni.close(drain_timeout_s=0.1)
        assert time.monotonic() - started < 2.0
        with pytest.raises(RequestAbortedError, match="shut down"):
            await request
        assert_idle(omni)
        assert_stopped(omni)
        assert all(r.process.exitcode == 0 for r in replicas_of(omni))
        with pytest.raises(ShuttingDownError):
            await collect(omni.generate({"prompt": "after"}))
    run(body())


def test_async_context_manager_stops_everything():
    async def body():
        async with AsyncOmni(single_pipeline(), log_level=ENGINE_LOG_LEVEL) as omni:
            outputs = await collect(omni.generate({"prompt": PROMPT}))
            assert _text(outputs) == PROMPT
            assert omni.health() == {"healthy": True, "in_flight": 0,
                                     "stages": {"s": {"live": 1, "replicas": 1, "restarts": 0}}}
        assert_stopped(omni)
    run(body())


# -- the blocking wrapper ----------------------------------------------------------------


def test_sync_omni_generate_stream_and_close(tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text(textwrap.dedent("""
        name: two
        stages:
          - {name: first, engine: echo, options: {chunks: 2}}
          - {name: second, engine: echo, options: {chunks: 3, delay_ms: 5}, final_output: text}
        edges:
          - {from: first, to: second}
    """))
    started = time.monotonic()
    omni = Omni(path, log_level=ENGINE_LOG_LEVEL)
    try:
        assert omni._omni.name == "two"
        outputs = omni.generate({"prompt": PROMPT})
        assert [o.data["index"] for o in chunk_outputs(outputs)] == [0, 1, 2]
        assert _text(outputs) == PROMPT
        assert outputs[-1].finished and set(outputs[-1].metrics["stages"]) == {"first",
                                                                               "second"}
        assert outputs[0].data["trace"] == ["first", "second"]

        streamed = []
        for out in omni.stream({"messages": [{"role": "user", "content": "from chat"}]},
                               params={"second": {"chunks": 4}}):
            streamed.append(out)
        assert [o.data["index"] for o in chunk_outputs(streamed)] == [0, 1, 2, 3]
        assert _text(streamed) == "from chat" and streamed[-1].finished

        # leaving a stream early aborts the request
        stream = omni.stream({"prompt": PROMPT}, params={"second": {"chunks": 50}})
        assert next(stream).data["index"] == 0
        stream.close()
        assert omni._call(_requests(omni._omni)) == 0
        processes = [r.process for r in replicas_of(omni._omni)]
        assert all(p.is_alive() for p in processes)
    finally:
        omni.close()
    assert all(p.exitcode == 0 for p in processes)
    assert_stopped(omni._omni)
    omni.close()  # idempotent
    assert time.monotonic() - started < 8


async def _requests(omni: AsyncOmni) -> int:
    return len(omni.orchestrator.requests)
