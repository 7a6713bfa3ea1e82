"""The engine's control channel: read by the main thread between steps and by a drainer
thread during them, so a sender is never held to one socket buffer per step."""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time

import pytest

from omni.engines.channel import ENGAGE_BYTES, Channel, OrchestratorGone
from omni.protocol import MAX_MESSAGE_BYTES, ProtocolError, frame


@pytest.fixture
def pair():
    engine_end, orchestrator_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    # a small send buffer, whatever the host's defaults: without the drainer a sender
    # could put at most this much on the wire per step
    orchestrator_end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    channel = Channel(engine_end)
    yield channel, orchestrator_end
    channel.close()
    engine_end.close()
    orchestrator_end.close()


@contextlib.contextmanager
def _step(channel: Channel):
    """One engine step, as EngineLoop brackets it."""
    channel.step_begins()
    try:
        yield
    finally:
        channel.step_ends()


def _engage(channel: Channel, peer: socket.socket) -> None:
    """Feed ENGAGE_BYTES between steps, so the drainer reads during the next step."""
    peer.sendall(frame(bytes(ENGAGE_BYTES)))
    assert channel.receive(block=True) == [bytes(ENGAGE_BYTES)]


def _messages(count: int, size: int) -> list[bytes]:
    return [i.to_bytes(4, "big") + bytes([i % 251]) * (size - 4) for i in range(count)]


def test_a_sender_is_not_held_to_one_socket_buffer_per_step(pair):
    channel, peer = pair
    messages = _messages(512, 8 * 1024)  # 4 MiB: 64 send buffers
    sent = threading.Event()

    def send_all():
        peer.sendall(b"".join(frame(m) for m in messages))
        sent.set()

    threading.Thread(target=send_all, daemon=True).start()
    got, steps = [], 0
    while not sent.is_set() and steps < 20:  # the engine loop: read, then a step
        got += channel.receive(block=False)
        with _step(channel):  # nothing on the main thread reads during a step
            sent.wait(timeout=0.5)
        steps += 1
    assert sent.is_set() and steps <= 3, f"the sender still sending after {steps} steps"
    got += channel.receive(block=False)
    assert got == messages  # all of them, in order


def test_without_the_drainer_the_stream_waits_for_the_steps():
    """inbound_drainer: false (to measure what the drainer buys): a heavy inbound stream
    no longer engages a reader during the step, so the sender is held to the socket's
    buffer until the step ends."""
    engine_end, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    channel = Channel(engine_end, drainer=False)
    sent = threading.Event()

    def send_all():
        with contextlib.suppress(OSError):  # the engine end closes before it is all sent
            peer.sendall(b"".join(frame(m) for m in _messages(512, 8 * 1024)))
            sent.set()

    sender = threading.Thread(target=send_all, daemon=True)
    try:
        _engage(channel, peer)  # heavy inbound since the last step: the drainer would read
        sender.start()
        with _step(channel):
            assert not channel._stepping.is_set()
            assert not sent.wait(timeout=0.2)  # nobody reads: the sender waits
            assert channel._inbox == []
    finally:
        channel.close()
        engine_end.close()
        sender.join(timeout=5)
        peer.close()


def test_the_drainer_stays_parked_for_a_trickle(pair):
    channel, peer = pair
    peer.sendall(frame(b"small"))
    assert channel.receive(block=True) == [b"small"]
    with _step(channel):
        assert not channel._stepping.is_set()  # a few bytes per step: no thread wakes
    peer.sendall(b"".join(frame(m) for m in _messages(16, 8 * 1024)))
    got = []
    while len(got) < 16:
        got += channel.receive(block=True)
    with _step(channel):
        assert channel._stepping.is_set()  # 128 KiB came in: it reads during this step


def test_an_idle_receive_waits_for_the_next_message(pair):
    channel, peer = pair
    assert channel.receive(block=False) == []
    threading.Timer(0.1, lambda: peer.sendall(frame(b"hello"))).start()
    assert channel.receive(block=True) == [b"hello"]


def test_a_message_read_as_a_step_ends_still_wakes_the_waiting_receiver(pair):
    """Messages landing around the end of steps, 300 times: none is lost or stuck in the
    inbox while the main thread waits on the socket (a lost wake-up would hang here)."""
    channel, peer = pair
    rng = random.Random(0)
    got: list[bytes] = []

    def serve():
        for i in range(300):
            delay = rng.uniform(0, 0.002)
            # 64 KiB messages: each step has the drainer engaged (ENGAGE_BYTES)
            message = i.to_bytes(4, "big") + bytes(ENGAGE_BYTES)
            threading.Timer(delay, peer.sendall, (frame(message),)).start()
            with _step(channel):
                time.sleep(rng.uniform(0, 0.002))
            while len(got) <= i:
                got.extend(channel.receive(block=True))

    worker = threading.Thread(target=serve, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), f"receive hung after {len(got)} messages"
    assert [m[:4] for m in got] == [i.to_bytes(4, "big") for i in range(300)]


@pytest.mark.parametrize("during_step", [False, True])
def test_a_closed_connection_raises_orchestrator_gone(pair, during_step):
    channel, peer = pair
    if during_step:
        _engage(channel, peer)
    peer.sendall(frame(b"last words"))
    if during_step:
        with _step(channel):
            peer.shutdown(socket.SHUT_WR)
            time.sleep(0.05)
    else:
        peer.shutdown(socket.SHUT_WR)
    assert channel.receive(block=True) == [b"last words"]  # what came first is kept
    with pytest.raises(OrchestratorGone):
        channel.receive(block=True)


def test_a_bad_frame_read_during_a_step_raises_in_the_main_thread(pair):
    channel, peer = pair
    _engage(channel, peer)
    with _step(channel):
        assert channel._stepping.is_set()
        peer.sendall(struct.pack("<I", MAX_MESSAGE_BYTES + 1) + b"x" * 16)
        time.sleep(0.05)
    with pytest.raises(ProtocolError):
        for _ in range(100):  # the drainer's failure surfaces on a later call at the latest
            channel.receive(block=False)
            time.sleep(0.01)


def test_close_stops_the_drainer(pair):
    channel, _ = pair
    drainer = channel._drainer
    channel.close()
    assert not drainer.is_alive()
    channel.close()  # again (the fixture's): nothing left to free


@pytest.mark.parametrize("after_engaged_step", [False, True])
def test_an_idle_receive_assembles_a_message_sent_in_pieces(pair, after_engaged_step):
    channel, peer = pair
    if after_engaged_step:
        _engage(channel, peer)
        with _step(channel):
            pass
    message = frame(b"x" * 1000)
    peer.sendall(message[:300])
    threading.Timer(0.1, peer.sendall, (message[300:],)).start()
    assert channel.receive(block=True) == [b"x" * 1000]


def test_the_engine_loop_takes_a_heavy_stream_in_while_it_steps():
    """EngineLoop brackets each step for the drainer: a producer streaming 4 MiB at 13 MB/s
    into a stage whose steps take 100 ms is done in about 4 steps, not at one socket
    buffer (here 128 KiB) per step: 32 steps."""
    from omni.engines.echo.engine import EchoEngine
    from omni.engines.proc import EngineLoop
    from omni.payloads import PayloadPlane
    from omni.protocol import FrameReader, Msg, decode, encode

    engine_end, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    engine = EchoEngine("talker", {"delay_ms": 100})
    channel = Channel(engine_end)
    payloads = PayloadPlane("test-channel-loop")
    loop = EngineLoop("talker/0", engine, channel, payloads)
    outputs: list = []

    def read_outputs():  # the orchestrator's side reads what the engine publishes
        reader = FrameReader()
        while data := peer.recv(1 << 20):
            outputs.extend(decode(m) for m in reader.feed(data))

    chunks = 512
    stream = [frame(encode(Msg.ADD, "r1", {"stream": ["thinker"]}, {}, time.monotonic()))]
    stream += [frame(encode(Msg.APPEND, "r1", "thinker", i, {"text": "x" * 8192},
                            i == chunks - 1, time.monotonic())) for i in range(chunks)]
    steps_when_sent = []

    def send_stream():  # paced like a producer stage: 64 KiB every 5 ms (13 MB/s)
        data = b"".join(stream)
        for start in range(0, len(data), 64 * 1024):
            peer.sendall(data[start:start + 64 * 1024])
            time.sleep(0.005)
        steps_when_sent.append(engine.steps)

    threads = [threading.Thread(target=f, daemon=True) for f in (loop.run, read_outputs,
                                                                 send_stream)]
    for thread in threads:
        thread.start()
    try:
        threads[2].join(timeout=60)
        assert steps_when_sent and steps_when_sent[0] <= 12, (
            f"the stream was still arriving after {engine.steps} steps")
    finally:
        loop.running = False
        peer.sendall(frame(encode(Msg.SHUTDOWN)))
        threads[0].join(timeout=10)
        channel.close()
        payloads.close()
        engine_end.close()  # the reader sees the end of the stream
        threads[1].join(timeout=10)
        peer.close()
    assert any(kind == Msg.OUTPUTS for kind, _ in outputs)
