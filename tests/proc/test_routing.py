"""Routing along a DAG of real echo engine processes: routes, completion sets, fan-in,
ordered per-modality outputs, final output and its metrics."""

from __future__ import annotations

import asyncio

import pytest
from procutil import (
    Tap,
    assert_idle,
    chunk_outputs,
    collect,
    dag_pipeline,
    echo_stage,
    make_pipeline,
    run,
    serving,
)

from omni.config.pipeline import UnknownModalityError

PROMPT = "hello multi-stage world"


def _check_final(outputs, stages: set[str]) -> dict:
    """The last output closes the request: finished, no data, per-stage metrics."""
    final = outputs[-1]
    assert final.finished is True and final.data is None
    assert all(not o.finished for o in outputs[:-1])
    metrics = final.metrics
    assert set(metrics["stages"]) == stages
    for stage, times in metrics["stages"].items():
        assert set(times) == {"queued", "first_output", "finished"}, stage
        assert 0 <= times["queued"] <= times["first_output"] <= times["finished"], stage
        assert times["finished"] <= metrics["e2e_s"], stage
    assert metrics["first_output_s"] is not None
    transit = metrics["transit"]  # every stage got >= 1 input and sent >= 1 output
    assert transit["messages"] >= 2 * len(stages)
    assert 0 < transit["chain_hop_s"] <= transit["hop_s"]
    assert 0 <= transit["chain_step_wait_s"] <= transit["step_wait_s"] < metrics["e2e_s"]
    return metrics["stages"]


def _check_stream(outputs, stage: str, modality: str, n: int, trace: list[str]) -> None:
    """One final stage's chunks: in order, complete, traced through the route."""
    chunks = chunk_outputs(outputs, stage)
    assert [o.data["index"] for o in chunks] == list(range(n))
    assert "".join(o.data["text"] for o in chunks) == PROMPT
    assert all(o.modality == modality for o in chunks)
    assert all(o.data["trace"] == trace for o in chunks)
    assert [o.stage_finished for o in chunks] == [False] * (n - 1) + [True]


def test_text_route_runs_only_its_stages():
    async def body():
        async with serving(dag_pipeline()) as omni:
            tap = Tap(omni)
            outputs = await collect(omni.generate(
                {"prompt": PROMPT}, modalities=["text"], request_id="t1",
                params={"*": {"chunks": 4}}))
            assert {o.stage for o in chunk_outputs(outputs)} == {"c"}
            _check_stream(outputs, "c", "text", 4, ["a", "b", "c"])
            times = _check_final(outputs, {"a", "b", "c"})
            # full delivery: each consumer is dispatched after its producer finished
            assert times["b"]["queued"] >= times["a"]["finished"]
            assert times["c"]["queued"] >= times["b"]["finished"]
            assert {r.stage for r in tap.of("t1")} == {"a", "b", "c"}  # side never ran
            # default_modalities is [text]: same route
            outputs = await collect(omni.generate({"prompt": PROMPT}, request_id="t2"))
            _check_final(outputs, {"a", "b", "c"})
            assert {r.stage for r in tap.of("t2")} == {"a", "b", "c"}
            assert_idle(omni)
    run(body())


def test_audio_route_runs_only_a_and_side():
    async def body():
        async with serving(dag_pipeline({"side": {"chunks": 3}})) as omni:
            tap = Tap(omni)
            outputs = await collect(omni.generate({"prompt": PROMPT}, modalities=["audio"],
                                                  request_id="au"))
            assert {o.stage for o in chunk_outputs(outputs)} == {"side"}
            _check_stream(outputs, "side", "audio", 3, ["a", "side"])  # stage option chunks
            _check_final(outputs, {"a", "side"})
            assert {r.stage for r in tap.of("au")} == {"a", "side"}
            assert_idle(omni)
    run(body())


def test_text_and_audio_finish_only_when_both_finals_finished():
    async def body():
        # side is much slower than c: the request must stay open until side is done.
        options = {"side": {"delay_ms": 60}}
        async with serving(dag_pipeline(options)) as omni:
            tap = Tap(omni)
            outputs = await collect(omni.generate(
                {"prompt": PROMPT}, modalities=["audio", "text"], request_id="both",
                params={"*": {"chunks": 3}}))
            _check_stream(outputs, "c", "text", 3, ["a", "b", "c"])
            _check_stream(outputs, "side", "audio", 3, ["a", "side"])
            times = _check_final(outputs, {"a", "b", "c", "side"})
            assert times["c"]["finished"] < times["side"]["finished"]
            c_done = next(i for i, o in enumerate(outputs)
                          if o.stage == "c" and o.stage_finished)
            side_done = next(i for i, o in enumerate(outputs)
                             if o.stage == "side" and o.stage_finished)
            assert c_done < side_done == len(outputs) - 2  # closed right after side's last
            assert {r.stage for r in tap.of("both")} == {"a", "b", "c", "side"}
            assert_idle(omni)
    run(body())


def test_fan_in_stage_receives_every_chunk_of_both_producers():
    async def body():
        # src -> left, src -> right, (left, right) -> join; right is the slower producer.
        pipeline = make_pipeline("diamond", [
            echo_stage("src"),
            echo_stage("left", chunks=3),
            echo_stage("right", chunks=2, delay_ms=50),
            echo_stage("join", final="text", chunks=5),
        ], [("src", "left"), ("src", "right"), ("left", "join"), ("right", "join")])
        async with serving(pipeline) as omni:
            tap = Tap(omni)
            outputs = await collect(omni.generate({"prompt": PROMPT}, request_id="fan"))
            chunks = chunk_outputs(outputs, "join")
            assert [o.data["index"] for o in chunks] == list(range(5))
            # join echoes left's chunks then right's chunks: the prompt twice, none lost
            assert "".join(o.data["text"] for o in chunks) == PROMPT + PROMPT
            assert chunks[-1].data["trace"] == ["src", "left", "right", "join"]
            times = _check_final(outputs, {"src", "left", "right", "join"})
            assert times["join"]["queued"] >= max(times["left"]["finished"],
                                                  times["right"]["finished"])
            assert len(tap.of("fan", "join")) == 5
            assert len(tap.of("fan", "left")) == 3 and len(tap.of("fan", "right")) == 2
            assert_idle(omni)
    run(body())


def test_concurrent_requests_keep_their_own_ordered_outputs():
    async def body():
        async with serving(dag_pipeline({"a": {"delay_ms": 5}, "c": {"delay_ms": 5}})) as omni:
            prompts = [f"request number {i} says hi" for i in range(6)]
            results = await asyncio.gather(*(
                collect(omni.generate({"prompt": p}, modalities=["text", "audio"],
                                      params={"*": {"chunks": 1 + i}}))
                for i, p in enumerate(prompts)))
            for i, (prompt, outputs) in enumerate(zip(prompts, results, strict=True)):
                for stage in ("c", "side"):
                    chunks = chunk_outputs(outputs, stage)
                    assert [o.data["index"] for o in chunks] == list(range(1 + i))
                    assert "".join(o.data["text"] for o in chunks) == prompt
                assert outputs[-1].finished
            assert_idle(omni)
    run(body())


def test_unknown_modality_is_refused_without_leaking_state():
    async def body():
        async with serving(dag_pipeline()) as omni:
            with pytest.raises(UnknownModalityError, match="video"):
                await collect(omni.generate({"prompt": PROMPT}, modalities=["video"]))
            assert_idle(omni)
            outputs = await collect(omni.generate({"prompt": PROMPT}, modalities="audio"))
            _check_final(outputs, {"a", "side"})
    run(body())
