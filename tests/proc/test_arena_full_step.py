"""One engine step whose outputs together outgrow the producer's shared-memory arena: each
payload fits alone, all of them do not. The engine process sends the rows published so
far before it waits for room, so their readers can release them; every request succeeds.

Before, the step's rows went out in one message after every payload was in the arena, so
the wait for room could only time out: the diffusion stage that finished four 832x480x33
videos (40 MB each) in one step, in its 64 MiB arena, failed three of them after 5 s each
(an H100, `bench videos --family wan22_ti2v --sides ours-http` at c=4)."""

from __future__ import annotations

import asyncio

from procutil import collect, run, serving

from omni.config.pipeline import parse_pipeline

PAYLOAD = 96 * 1024  # two 64 KiB blocks: above the inline threshold, so in the arena
ARENA_MB = 0.25  # four blocks: two payloads at a time
REQUESTS = 5


def pipeline():
    # delay_ms: the first request's step sleeps while the others arrive, so the next step
    # finishes those four together (8 blocks of payload against an arena of 4)
    return parse_pipeline({"name": "arena-step", "stages": [
        {"name": "a", "engine": "echo", "final_output": "text",
         "options": {"payload_arena_mb": ARENA_MB, "delay_ms": 300},
         "params": {"chunks": 1, "payload_bytes": PAYLOAD}}]})


def test_a_step_whose_outputs_outgrow_the_arena_serves_every_request():
    async def body():
        async with serving(pipeline()) as omni:
            first = asyncio.ensure_future(collect(omni.generate({"prompt": "first"},
                                                                request_id="r0")))
            await asyncio.sleep(0.1)  # r0's step has begun: the rest wait for the next
            rest = [collect(omni.generate({"prompt": f"request {i}"}, request_id=f"r{i}"))
                    for i in range(1, REQUESTS)]
            results = await asyncio.gather(first, *rest, return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            assert not failed, failed
            for outputs in results:
                blobs = [o.data["blob"] for o in outputs if o.data and "blob" in o.data]
                assert blobs and all(b.numel() == PAYLOAD for b in blobs), outputs
            stats = omni.orchestrator.engines.pools["a"].replicas[0].stats
            assert stats.get("shm_full_waits", 0) >= 1, stats  # the step did outgrow it
            assert stats.get("shm_full_errors") == 0, stats  # and no put gave up
    run(body())
