"""Generated control messages in a live replica's stream (hypothesis): whatever a replica
sends the orchestrator, decoding and every handler drop what is malformed, the request in
flight finishes with its right text, the replica is never marked dead by it, and the
event loop sees no stray exception. The unit properties are in tests/unit/test_fuzz_wire.py;
hand-picked cases (and foreign peers) in test_wire_robustness.py."""

from __future__ import annotations

import asyncio
import threading

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from procutil import assert_idle, chunk_outputs, collect, serving, single_pipeline

from omni.wire.protocol import Abort, AbortAck, Add, Free, Heartbeat, Outputs, Ready, SessionReply

# a replica's own messages (by their tags); Dead is left out: from the real replica it is a
# real death notice
TAGS = [m.__struct_config__.tag for m in (Ready, Outputs, Heartbeat, AbortAck, SessionReply,
                                          Add, Abort, Free)] + [99]
scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats()
           | st.sampled_from(["s/0", "other/0", "", "aborted", "sent_at", "x"])
           | st.binary(max_size=8))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.sampled_from(["aborted", "sent_at", "session_bytes",
                                                         "inbound", "step_s", "gc_s", "k"]),
                                        inner, max_size=3), max_leaves=12)
bodies = (st.lists(values, max_size=4) | st.tuples(st.just("s/0"), values, values).map(list)
          | st.tuples(st.just("s/0"), values, st.floats(), values, values).map(list))
frames = (st.tuples(st.sampled_from(TAGS), bodies)
          .map(lambda kb: msgpack.packb([kb[0], *kb[1]], use_bin_type=True))
          | st.binary(max_size=24))


@pytest.fixture(scope="module")
def live():
    """A serving pipeline on its own loop thread, shared by every example."""
    loop = asyncio.new_event_loop()
    errors: list[dict] = []
    loop.set_exception_handler(lambda _, ctx: errors.append(ctx))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    stop: asyncio.Event | None = None

    async def hold(ready: asyncio.Future) -> None:
        async with serving(single_pipeline(delay_ms=2)) as omni:
            ready.set_result(omni)
            await stop.wait()

    async def begin() -> asyncio.Future:
        nonlocal stop
        stop = asyncio.Event()
        ready = loop.create_future()
        loop.create_task(hold(ready))
        return await ready

    omni = asyncio.run_coroutine_threadsafe(begin(), loop).result(120)
    yield loop, omni, errors
    asyncio.run_coroutine_threadsafe(_set(stop), loop).result(60)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(60)


async def _set(event: asyncio.Event) -> None:
    event.set()
    await asyncio.sleep(1.0)  # serving's exit closes the pipeline and checks it


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(frames, min_size=1, max_size=12))
def test_generated_replica_messages_are_dropped_and_serving_goes_on(live, messages):
    loop, omni, errors = live

    async def body() -> None:
        group = omni.orchestrator.engines
        replica = group.replicas["s/0"]
        agen = omni.generate({"prompt": "still right"}, params={"*": {"chunks": 3}},
                             timeout_s=10)
        head = asyncio.ensure_future(agen.__anext__())
        await asyncio.sleep(0)
        for message in messages:  # as if the replica had sent them
            group.on_message(replica.identity, message)
        outputs = [await head, *await collect(agen)]
        assert "".join(o.data["text"] for o in chunk_outputs(outputs)) == "still right"
        assert replica.alive and omni.health()["healthy"]
        assert_idle(omni)

    asyncio.run_coroutine_threadsafe(body(), loop).result(30)
    assert errors == []
