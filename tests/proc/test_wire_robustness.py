"""Garbage on the control plane: from foreign peers of the orchestrator's ROUTER (strangers,
a retired incarnation, a hijacker of a live identity), raw bytes on its socket, and
misshapen messages from a real replica. Each is logged and dropped, and the pipeline
keeps serving."""

from __future__ import annotations

import asyncio
import logging
import socket

import msgpack
import zmq
from procutil import assert_idle, chunk_outputs, collect, run, serving, single_pipeline, wait_until

from omni.wire.protocol import AbortAck, Add, Outputs, Ready, Row, SessionReply, encode

# What a foreign peer may send: none of its identities is a current replica's, so every
# message is dropped (each stranger logged once).
FOREIGN_FIRST = [
    msgpack.packb([99]),  # unknown type
    b"\xc1",  # bad msgpack
    msgpack.packb({"replica": "s/0"}),  # a map, not a message
    encode(Outputs("s/0", [], 0.0)),  # not Ready/Dead first
    encode(Ready("nobody/0", {})),  # unknown replica
    encode(Ready("s/0", {})),  # already connected: no hijacking
]

# Messages in a real replica's stream with fields of the wrong type or number (encode
# writes what it is given; decode checks).
MISSHAPEN = [
    msgpack.packb([11, "s/0"]),  # an Outputs missing its fields
    encode(Outputs("s/0", "not rows", 0.0)),
    encode(Outputs("s/0", [[1, 2]], 0.0)),
    encode(Outputs(["unhashable"], [], 0.0)),
    encode(Outputs("other/0", [], 0.0)),  # names another replica
    encode(Outputs("s/0", [Row("r", None, True, ("engine",))], 0.0)),  # error not a pair
    encode(AbortAck("s/0", "r", 0.0)),  # ids not a list
    encode(SessionReply("s/0", [], 0.0)),  # stats not a map
    encode(Ready("s/0", {})),  # Ready twice
    encode(Add("r", {}, {}, 0.0)),  # an orchestrator->engine type
]


def _dropped(caplog) -> int:
    return sum("dropping malformed engine message" in r.getMessage() for r in caplog.records
               if r.name == "omni.runtime.launcher")


def _strangers(caplog) -> int:
    return sum("not a current replica" in r.getMessage() for r in caplog.records)


def _foreign(address: str, identity: bytes, payload: bytes) -> None:
    """A DEALER the launcher did not start: connect, send, leave."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(address)
    sock.send(payload)
    sock.close()  # lingers until sent
    context.term()


def _garbage(path: str) -> bool:
    """Raw bytes that are no ZMTP greeting, to the ipc socket: libzmq hangs up."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(path)
        sock.sendall(b"\xff" * 64 + b"GET / HTTP/1.1\r\n\r\n" * 20)
        try:
            while sock.recv(4096):  # libzmq's own greeting, then its hang-up
                pass
        except ConnectionResetError:  # a hang-up with our bytes unread
            pass
        except TimeoutError:
            return False
        return True


def test_foreign_peers_are_ignored_and_the_pipeline_keeps_serving(caplog):
    caplog.set_level(logging.WARNING, logger="omni.runtime.launcher")

    async def body():
        async with serving(single_pipeline(delay_ms=5)) as omni:
            address = omni.orchestrator.engines.control_address
            request = asyncio.create_task(collect(omni.generate(
                {"prompt": "still here"}, params={"*": {"chunks": 5}})))
            strangers = [b"nobody/0@0", b"s/0@1", b"s/0", b"s/0@0#hbx"]
            for identity in strangers:
                for message in FOREIGN_FIRST:
                    await asyncio.to_thread(_foreign, address, identity, message)
            # the replica's own identity: libzmq refuses a second peer of the same name
            await asyncio.to_thread(_foreign, address, b"s/0@0",
                                    encode(Outputs("s/0", [Row("x", None, True)], 0.0)))
            outputs = await request
            assert "".join(o.data["text"] for o in chunk_outputs(outputs)) == "still here"
            await wait_until(lambda: _strangers(caplog) == len(strangers), 3.0,
                             "each stranger to be logged once")
            assert _dropped(caplog) == 0
            assert omni.health()["healthy"]
            outputs = await collect(omni.generate({"prompt": "and again"}))
            assert outputs[-1].finished
            assert_idle(omni)
    run(body())


def test_garbage_bytes_on_the_control_socket_close_only_that_connection():
    async def body():
        async with serving(single_pipeline()) as omni:
            path = omni.orchestrator.engines.control_address.removeprefix("ipc://")
            assert await asyncio.to_thread(_garbage, path)
            outputs = await collect(omni.generate({"prompt": "fine"}))
            assert outputs[-1].finished
    run(body())


def test_misshapen_messages_in_a_replica_stream_are_dropped(caplog):
    caplog.set_level(logging.ERROR, logger="omni.runtime.launcher")

    async def body():
        loop_errors: list[dict] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: loop_errors.append(ctx))
        async with serving(single_pipeline(delay_ms=20)) as omni:
            group = omni.orchestrator.engines
            replica = group.replicas["s/0"]
            agen = omni.generate({"prompt": "survive"}, params={"*": {"chunks": 5}},
                                 timeout_s=3)
            head = asyncio.create_task(agen.__anext__())
            await asyncio.sleep(0)  # submitted: the engine is working on it
            for message in MISSHAPEN:  # as if the replica had sent them
                group.on_message(replica.identity, message)
            outputs = [await head, *await collect(agen)]
            assert "".join(o.data["text"] for o in chunk_outputs(outputs)) == "survive"
            outputs = await collect(omni.generate({"prompt": "again"}, timeout_s=3))
            assert outputs[-1].finished
            assert _dropped(caplog) == len(MISSHAPEN)
            assert omni.health()["healthy"]
            assert loop_errors == []
    run(body(), timeout_s=15)
