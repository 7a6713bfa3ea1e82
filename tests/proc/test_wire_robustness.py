"""Garbage on the orchestrator's result (PULL) socket, from a foreign PUSH peer: each
malformed message is logged and dropped, and the pipeline keeps serving."""

from __future__ import annotations

import asyncio
import logging
import time

import msgpack
import zmq
from procutil import assert_idle, chunk_outputs, collect, run, serving, single_pipeline, wait_until

from omni.protocol import Msg

OUTPUTS = bytes([Msg.OUTPUTS])

# Messages decode() rejects (ProtocolError): wrong frame count, bad type byte, bad msgpack,
# a non-array body, an unknown or absent replica, a type that does not belong here.
UNDECODABLE = [
    [b"just one frame"],
    [OUTPUTS, msgpack.packb(["s/0", [], {}]), b"third frame"],
    [b"\xff", msgpack.packb([])],
    [b"\x0b\x0b", msgpack.packb([])],
    [OUTPUTS, b"\xc1"],
    [OUTPUTS, b""],
    [OUTPUTS, b"\x92\x01"],  # truncated array
    [OUTPUTS, msgpack.packb({"replica": "s/0"})],
    [OUTPUTS, msgpack.packb([])],
    [OUTPUTS, msgpack.packb(["nobody/0", [], {}])],
    [bytes([Msg.ADD]), msgpack.packb(["s/0", {}, {}])],
    [bytes([Msg.READY]), msgpack.packb(["s/0", {}])],
]

# Well-formed msgpack arrays from a known replica id, with a body of the wrong shape.
MISSHAPEN = [
    [OUTPUTS, msgpack.packb(["s/0"])],
    [OUTPUTS, msgpack.packb(["s/0", "not rows", {}])],
    [OUTPUTS, msgpack.packb(["s/0", [[1, 2]], {}])],
    [OUTPUTS, msgpack.packb([["unhashable"], [], {}])],
    [bytes([Msg.DEAD]), msgpack.packb([])],
]


class _Intruder:
    """A PUSH socket connected to the orchestrator's PULL, like a rogue engine."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.setsockopt(zmq.LINGER, 0)
        self.push.connect(endpoint)

    def send(self, messages: list[list[bytes]]) -> None:
        for frames in messages:
            self.push.send_multipart(frames)

    def close(self) -> None:
        self.push.close()
        self.ctx.term()


def _dropped(caplog) -> int:
    return sum("dropping malformed engine message" in r.getMessage() for r in caplog.records
               if r.name == "omni.launcher")


def test_undecodable_messages_are_logged_and_dropped(caplog):
    caplog.set_level(logging.ERROR, logger="omni.launcher")

    async def body():
        async with serving(single_pipeline(delay_ms=5)) as omni:
            intruder = _Intruder(omni.orchestrator.engines.endpoints.results)
            try:
                intruder.send(UNDECODABLE)
                # interleave garbage with a live request's results
                request = asyncio.create_task(collect(omni.generate(
                    {"prompt": "still here"}, params={"*": {"chunks": 5}})))
                intruder.send(UNDECODABLE)
                outputs = await request
                assert "".join(o.data["text"] for o in chunk_outputs(outputs)) == "still here"
                await wait_until(lambda: _dropped(caplog) == 2 * len(UNDECODABLE), 3.0,
                                 "every malformed message to be logged")
                assert omni.health()["healthy"]
                outputs = await collect(omni.generate({"prompt": "and again"}))
                assert outputs[-1].finished
                assert_idle(omni)
            finally:
                intruder.close()
    run(body())


def test_misshapen_messages_are_logged_and_dropped_and_pipeline_keeps_serving(caplog):
    caplog.set_level(logging.ERROR, logger="omni.launcher")

    async def body():
        loop_errors: list[dict] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: loop_errors.append(ctx))
        async with serving(single_pipeline(delay_ms=20)) as omni:
            intruder = _Intruder(omni.orchestrator.engines.endpoints.results)
            try:
                intruder.send(UNDECODABLE[:1])  # wait until the intruder is connected
                await wait_until(lambda: _dropped(caplog) == 1, 3.0, "intruder connected")
                agen = omni.generate({"prompt": "survive"}, params={"*": {"chunks": 5}},
                                     timeout_s=3)
                head = asyncio.create_task(agen.__anext__())
                await asyncio.sleep(0)  # submitted: the engine is working on it
                intruder.send(MISSHAPEN)
                time.sleep(0.3)  # hold the loop: garbage and results queue up together
                outputs = [await head, *await collect(agen)]
                assert "".join(o.data["text"] for o in chunk_outputs(outputs)) == "survive"
                outputs = await collect(omni.generate({"prompt": "again"}, timeout_s=3))
                assert outputs[-1].finished
                await wait_until(lambda: _dropped(caplog) == 1 + len(MISSHAPEN), 3.0,
                                 "every misshapen message to be logged as dropped")
                assert loop_errors == []
            finally:
                intruder.close()
    run(body(), timeout_s=15)
