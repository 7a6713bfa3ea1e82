"""The engine's end of the control plane (omni/engines/proc/channel.py) against a real
ROUTER: blocking and non-blocking receives, a heavy stream queued while the engine is
busy (its sender never waits on the engine), heartbeats from their own socket, and the
Dead notice that waits for its acknowledgement."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from omni.engines.proc.channel import HEARTBEAT_SUFFIX, Channel
from omni.wire.protocol import (
    Abort,
    Append,
    Dead,
    Heartbeat,
    Message,
    Ready,
    Shutdown,
    decode,
    encode,
    identity,
)


class Orchestrator:
    """A bare ROUTER, as omni/runtime/control.py binds it."""

    def __init__(self, address: str) -> None:
        self.context = zmq.Context()
        self.sock = self.context.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.SNDHWM, 100_000)
        self.sock.bind(address)

    def recv(self, timeout_s: float = 5.0) -> tuple[bytes, Message]:
        assert self.sock.poll(int(timeout_s * 1000)), "nothing arrived"
        who, message = self.sock.recv_multipart()
        return who, decode(message)

    def close(self) -> None:
        self.sock.close(0)
        self.context.term()


@pytest.fixture
def plane(tmp_path):
    address = f"ipc://{tmp_path}/control.sock"
    orchestrator = Orchestrator(address)
    channel = Channel(address, identity("s/0", 0), "s/0")
    channel.send(encode(Ready("s/0", {})))
    assert orchestrator.recv() == (b"s/0@0", Ready("s/0", {}))
    yield orchestrator, channel
    channel.close()
    orchestrator.close()


def test_an_idle_receive_waits_for_the_next_message(plane):
    orchestrator, channel = plane
    assert channel.receive(block=False) == []
    threading.Timer(0.05, orchestrator.sock.send_multipart,
                    ([b"s/0@0", encode(Abort(["r"]))],)).start()
    assert [decode(m) for m in channel.receive(block=True)] == [Abort(["r"])]


def test_a_heavy_stream_is_queued_while_the_engine_is_busy(plane):
    """4 MiB of Appends (8 KiB each) sent while the engine's main thread reads nothing:
    every send completes at once (libzmq's I/O thread receives for the busy engine; a
    Unix socket would have held the sender at ~208 KiB), and all arrive in order."""
    orchestrator, channel = plane
    rows = 512
    for seq in range(rows):
        orchestrator.sock.send_multipart(
            [b"s/0@0", encode(Append("r", "up", seq, {"x": b"x" * 8192}, False, 0.0))],
            zmq.NOBLOCK)  # zmq.Again here would mean the sender was held back
    got: list = []
    deadline = time.monotonic() + 10
    while len(got) < rows and time.monotonic() < deadline:
        got += channel.receive(block=True)
    assert [decode(m).seq for m in got] == list(range(rows))


def test_more_than_a_thousand_messages_wait_for_a_stalled_engine(plane):
    orchestrator, channel = plane
    for i in range(3000):
        orchestrator.sock.send_multipart([b"s/0@0", encode(Abort([f"r{i}"]))], zmq.NOBLOCK)
    got: list = []
    while len(got) < 3000:
        got += channel.receive(block=True)
    assert [decode(m).request_ids[0] for m in got] == [f"r{i}" for i in range(3000)]


def test_a_send_to_a_peer_that_is_not_connected_is_an_error(plane):
    orchestrator, _ = plane
    with pytest.raises(zmq.ZMQError) as info:
        orchestrator.sock.send_multipart([b"s/0@1", encode(Shutdown())], zmq.NOBLOCK)
    assert info.value.errno == zmq.EHOSTUNREACH


def test_heartbeats_come_from_their_own_identity(tmp_path):
    address = f"ipc://{tmp_path}/control.sock"
    orchestrator = Orchestrator(address)
    channel = Channel(address, identity("s/0", 2), "s/0", heartbeat_s=0.05)
    try:
        beats = [orchestrator.recv() for _ in range(3)]
    finally:
        channel.close()
        orchestrator.close()
    assert all(b == (b"s/0@2" + HEARTBEAT_SUFFIX, Heartbeat("s/0")) for b in beats)


def test_a_death_notice_waits_for_its_acknowledgement(plane):
    orchestrator, channel = plane

    def acknowledge():
        who, message = orchestrator.recv()
        assert message == Dead("s/0", "boom")
        orchestrator.sock.send_multipart([who, encode(Shutdown())])

    thread = threading.Thread(target=acknowledge)
    thread.start()
    started = time.monotonic()
    channel.say_dead(encode(Dead("s/0", "boom")), wait_s=10.0)
    assert time.monotonic() - started < 5.0  # acknowledged, not timed out
    thread.join(timeout=5)


def test_a_death_notice_nobody_acknowledges_gives_up_after_its_wait(plane):
    _, channel = plane
    started = time.monotonic()
    channel.say_dead(encode(Dead("s/0", "boom")), wait_s=0.2)
    assert 0.15 < time.monotonic() - started < 5.0
