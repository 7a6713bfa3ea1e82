"""Garbage on the control plane: from a foreign connection to the orchestrator's control
socket, and inside a real replica's own stream. Each bad message is logged and dropped
(or the foreign connection closed), and the pipeline keeps serving."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct

import msgpack
from procutil import assert_idle, chunk_outputs, collect, run, serving, single_pipeline, wait_until

from omni.protocol import MAX_MESSAGE_BYTES, Msg, frame

OUTPUTS = bytes([Msg.OUTPUTS])

# First messages a foreign connection may send: none of them names a replica that may
# connect, so each is dropped and its connection closed.
FOREIGN_FIRST = [
    b"\xff" + msgpack.packb([]),  # unknown type
    OUTPUTS + b"\xc1",  # bad msgpack
    OUTPUTS + msgpack.packb({"replica": "s/0"}),  # map body
    OUTPUTS + msgpack.packb(["s/0", [], {}]),  # not READY/DEAD first
    bytes([Msg.READY]) + msgpack.packb(["nobody/0", {}]),  # unknown replica
    bytes([Msg.READY]) + msgpack.packb(["s/0", {}]),  # already connected: no hijacking
]

# Well-formed messages in a real replica's stream with a body of the wrong shape.
MISSHAPEN = [
    OUTPUTS + msgpack.packb(["s/0"]),
    OUTPUTS + msgpack.packb(["s/0", "not rows", {}]),
    OUTPUTS + msgpack.packb(["s/0", [[1, 2]], {}]),
    OUTPUTS + msgpack.packb([["unhashable"], [], {}]),
    OUTPUTS + msgpack.packb(["other/0", [], {}]),  # names another replica
    bytes([Msg.READY]) + msgpack.packb(["s/0", {}]),  # READY twice
    bytes([Msg.ADD]) + msgpack.packb(["r", {}, {}, 0.0]),  # an orchestrator->engine type
]


def _dropped(caplog) -> int:
    return sum("dropping malformed engine message" in r.getMessage() for r in caplog.records
               if r.name == "omni.runtime.launcher")


def _foreign(path: str, payload: bytes) -> bool:
    """Connect, send, and report whether the orchestrator hung up on us."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(3)
        sock.connect(path)
        sock.sendall(payload)
        try:
            return sock.recv(1) == b""
        except TimeoutError:
            return False


def test_foreign_connections_are_dropped_and_closed(caplog):
    caplog.set_level(logging.ERROR, logger="omni.runtime.launcher")

    async def body():
        async with serving(single_pipeline(delay_ms=5)) as omni:
            path = omni.orchestrator.engines.control_path
            request = asyncio.create_task(collect(omni.generate(
                {"prompt": "still here"}, params={"*": {"chunks": 5}})))
            for message in FOREIGN_FIRST:
                assert await asyncio.to_thread(_foreign, path, frame(message)), message
            outputs = await request
            assert "".join(o.data["text"] for o in chunk_outputs(outputs)) == "still here"
            await wait_until(lambda: _dropped(caplog) == len(FOREIGN_FIRST), 3.0,
                             "every foreign message to be logged")
            assert omni.health()["healthy"]
            outputs = await collect(omni.generate({"prompt": "and again"}))
            assert outputs[-1].finished
            assert_idle(omni)
    run(body())


def test_a_corrupt_length_closes_only_that_connection(caplog):
    caplog.set_level(logging.ERROR, logger="omni.runtime.launcher")

    async def body():
        async with serving(single_pipeline()) as omni:
            path = omni.orchestrator.engines.control_path
            huge = struct.pack("<I", MAX_MESSAGE_BYTES + 1) + b"x"
            assert await asyncio.to_thread(_foreign, path, huge)
            assert any("closing an engine connection" in r.getMessage()
                       for r in caplog.records)
            outputs = await collect(omni.generate({"prompt": "fine"}))
            assert outputs[-1].finished
    run(body())


def test_misshapen_messages_in_a_replica_stream_are_dropped(caplog):
    caplog.set_level(logging.ERROR, logger="omni.runtime.launcher")

    async def body():
        loop_errors: list[dict] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: loop_errors.append(ctx))
        async with serving(single_pipeline(delay_ms=20)) as omni:
            connection = omni.orchestrator.engines.replicas["s/0"].connection
            agen = omni.generate({"prompt": "survive"}, params={"*": {"chunks": 5}},
                                 timeout_s=3)
            head = asyncio.create_task(agen.__anext__())
            await asyncio.sleep(0)  # submitted: the engine is working on it
            # as if the replica had written them: one chunk of the stream, all at once
            connection.data_received(b"".join(frame(m) for m in MISSHAPEN))
            outputs = [await head, *await collect(agen)]
            assert "".join(o.data["text"] for o in chunk_outputs(outputs)) == "survive"
            outputs = await collect(omni.generate({"prompt": "again"}, timeout_s=3))
            assert outputs[-1].finished
            assert _dropped(caplog) == len(MISSHAPEN)
            assert omni.health()["healthy"]
            assert loop_errors == []
    run(body(), timeout_s=15)
