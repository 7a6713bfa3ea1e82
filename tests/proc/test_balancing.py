"""Replica pools with real engine processes: sticky per-request binding and balancing."""

from __future__ import annotations

import asyncio
from collections import Counter

from procutil import (
    Tap,
    assert_idle,
    chunk_outputs,
    collect,
    echo_stage,
    make_pipeline,
    run,
    serving,
)


def _pool_pipeline():
    # entry stage r has 3 replicas; f (1 replica) consumes it
    return make_pipeline("pool", [
        echo_stage("r", replicas=3, chunks=4, delay_ms=15),
        echo_stage("f", final="text", chunks=2),
    ], [("r", "f")])


def test_concurrent_requests_spread_over_replicas_and_stay_bound():
    async def body():
        async with serving(_pool_pipeline()) as omni:
            tap = Tap(omni)
            pool = omni.orchestrator.engines.pools["r"]
            pids = {r.info["pid"] for r in pool.replicas}
            assert pids == {r.process.pid for r in pool.replicas} and len(pids) == 3

            ids = [f"q{i}" for i in range(6)]
            tasks = [asyncio.create_task(collect(omni.generate(
                {"prompt": f"prompt {i}"}, request_id=rid))) for i, rid in enumerate(ids)]
            await asyncio.sleep(0)  # every task has submitted (and dispatched to r)
            bound = {rid: omni.orchestrator.requests[rid].bound["r"] for rid in ids}
            # least outstanding work: 6 concurrent requests -> 2 on each replica
            assert Counter(r.replica_id for r in bound.values()) == \
                {"r/0": 2, "r/1": 2, "r/2": 2}
            for replica in pool.replicas:
                assert replica.outstanding == {omni.orchestrator.requests[rid].engine_id
                                               for rid in ids if bound[rid] is replica}

            results = await asyncio.gather(*tasks)
            for i, (rid, outputs) in enumerate(zip(ids, results, strict=True)):
                assert "".join(o.data["text"] for o in chunk_outputs(outputs)) == f"prompt {i}"
                # every row of the request at r came from the one replica it was bound to
                rows = tap.of(rid, "r")
                assert [r.data["index"] for r in rows] == [0, 1, 2, 3]
                assert {r.replica_id for r in rows} == {bound[rid].replica_id}
                assert {r.replica_id for r in tap.of(rid, "f")} == {"f/0"}
            assert_idle(omni)
    run(body())


def test_sequential_requests_rotate_over_idle_replicas():
    async def body():
        async with serving(_pool_pipeline()) as omni:
            tap = Tap(omni)
            for i in range(6):
                await collect(omni.generate({"prompt": "x"}, request_id=f"s{i}"))
            used = [tap.of(f"s{i}", "r")[0].replica_id for i in range(6)]
            # ties (all idle) are broken round-robin: each replica gets its turn
            assert Counter(used) == {"r/0": 2, "r/1": 2, "r/2": 2}
            assert len(set(used[:3])) == 3
            assert_idle(omni)
    run(body())
