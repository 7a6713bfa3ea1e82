"""Stream edges between real engine processes: consumers start with the request, get
numbered chunks as the producer makes them, and finish on the producer's last chunk."""

from __future__ import annotations

import asyncio

import pytest
from procutil import (
    Tap,
    assert_idle,
    chunk_outputs,
    collect,
    echo_stage,
    run,
    serving,
    wait_until,
)

from omni.config.pipeline import parse_pipeline
from omni.errors import RequestAbortedError, RequestFailedError
from omni.wire.protocol import Append, encode

STEP_MS = 30


def stream_chain(kinds: tuple[str, ...] = ("stream", "stream"), *, delay_ms: int = STEP_MS):
    """a -> b -> c with the given deliveries; c outputs text."""
    return parse_pipeline({
        "name": "streams",
        "stages": [echo_stage("a", delay_ms=delay_ms), echo_stage("b"),
                   echo_stage("c", final="text")],
        "edges": [{"from": "a", "to": "b", "delivery": kinds[0]},
                  {"from": "b", "to": "c", "delivery": kinds[1]}],
    })


def _text(outputs) -> str:
    return "".join(o.data["text"] for o in chunk_outputs(outputs))


def test_stream_chain_starts_consumers_early_and_keeps_order():
    async def body():
        async with serving(stream_chain()) as omni:
            outputs = await collect(omni.generate({"prompt": "streaming works"},
                                                  params={"a": {"chunks": 5}}))
            assert _text(outputs) == "streaming works"
            chunks = chunk_outputs(outputs)
            assert [o.data["index"] for o in chunks] == list(range(len(chunks)))
            assert chunks[-1].data["trace"] == ["a", "b", "c"]
            times = outputs[-1].metrics["stages"]
            # b and c were admitted with the request, not when a finished ...
            assert times["c"]["queued"] < times["a"]["first_output"]
            # ... and the client saw text before the producer at the head was done
            assert times["c"]["first_output"] < times["a"]["finished"]
            assert_idle(omni)
    run(body())


def test_full_delivery_waits_for_the_whole_producer():
    async def body():
        async with serving(stream_chain(("full", "full"))) as omni:
            outputs = await collect(omni.generate({"prompt": "all at once"},
                                                  params={"a": {"chunks": 4}}))
            assert _text(outputs) == "all at once"
            times = outputs[-1].metrics["stages"]
            assert times["b"]["queued"] >= times["a"]["finished"]
    run(body())


@pytest.mark.parametrize("kinds", [("stream", "full"), ("full", "stream")])
def test_mixed_deliveries(kinds):
    async def body():
        async with serving(stream_chain(kinds)) as omni:
            outputs = await collect(omni.generate({"prompt": "mixed edges"},
                                                  params={"a": {"chunks": 3}}))
            assert _text(outputs) == "mixed edges"
            assert_idle(omni)
    run(body())


def test_out_of_order_chunk_fails_only_that_request():
    async def body():
        async with serving(stream_chain(delay_ms=200)) as omni:
            tap = Tap(omni)
            victim = asyncio.create_task(collect(omni.generate(
                {"prompt": "victim"}, request_id="v", params={"a": {"chunks": 4}})))
            bystander = asyncio.create_task(collect(omni.generate(
                {"prompt": "bystander"}, request_id="b", params={"a": {"chunks": 4}})))
            await tap.first(lambda r: r.request_id == "v" and r.stage == "a")
            state = omni.orchestrator.requests["v"]
            consumer = state.bound["b"]
            # a chunk far ahead of the next expected sequence number
            omni.orchestrator.engines.send(consumer, encode(
                Append(state.engine_id, "a", 99, {"text": "x"}, False, 0.0)))
            with pytest.raises(RequestFailedError, match="expected chunk"):
                await victim
            assert _text(await bystander) == "bystander"
            assert_idle(omni)
    run(body())


def test_abort_mid_stream_frees_every_stage():
    async def body():
        async with serving(stream_chain(delay_ms=100)) as omni:
            tap = Tap(omni)
            task = asyncio.create_task(collect(omni.generate(
                {"prompt": "abort me"}, request_id="x", params={"a": {"chunks": 8}})))
            await tap.first(lambda r: r.request_id == "x" and r.stage == "c")
            assert await omni.abort("x")
            with pytest.raises(RequestAbortedError):
                await task
            assert_idle(omni)
            # the engines forgot it: the next request's rows show one running job each
            outputs = await collect(omni.generate({"prompt": "next"}, request_id="n"))
            assert _text(outputs) == "next"
            await wait_until(lambda: all(r.stats.get("running", 0) <= 1 for r in tap.of("n")))
    run(body())


def test_producer_failure_mid_stream_fails_the_request():
    async def body():
        async with serving(stream_chain()) as omni:
            with pytest.raises(RequestFailedError, match="stage 'b'"):
                await collect(omni.generate({"prompt": "fail"}, params={
                    "a": {"chunks": 3}, "b": {"echo_fail": "step", "echo_fail_stage": "b"}}))
            assert_idle(omni)
    run(body())
