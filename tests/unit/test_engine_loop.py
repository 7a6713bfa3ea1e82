"""EngineLoop (omni/engines/proc.py): what arrives while an idle engine handles the message
that woke it runs in the same step, not a step later."""

from __future__ import annotations

import socket
import threading
import time

from omni.engines.channel import Channel
from omni.engines.echo.engine import EchoEngine
from omni.engines.proc import EngineLoop
from omni.payloads import PayloadPlane
from omni.protocol import FrameReader, Msg, decode, encode, frame


class _BurstEcho(EchoEngine):
    """Echo engine that records how many requests each step runs; adding the first
    request sends the rest of the burst (as an orchestrator finishing a batch upstream
    does, one ADD each, while the engine is still handling the first)."""

    def __init__(self, peer: socket.socket, burst: int) -> None:
        super().__init__("code2wav")
        self.peer, self.burst, self.step_sizes = peer, burst, []

    def add(self, request) -> None:
        super().add(request)
        if request.request_id == "r0":
            self.peer.sendall(b"".join(_add(f"r{i}") for i in range(1, self.burst)))

    def step(self):
        self.step_sizes.append(sum(job.runnable() for job in self.jobs.values()))
        return super().step()


def _add(rid: str) -> bytes:
    return frame(encode(Msg.ADD, rid, {"prompt": "hello"}, {}, time.monotonic()))


def test_a_burst_that_arrives_while_the_first_is_handled_runs_in_one_step():
    engine_end, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    engine = _BurstEcho(peer, burst=8)
    channel = Channel(engine_end)
    payloads = PayloadPlane("test-engine-loop")
    loop = EngineLoop("code2wav/0", engine, channel, payloads)
    finished: list[str] = []
    done = threading.Event()

    def read_outputs():
        reader = FrameReader()
        while not done.is_set() and (data := peer.recv(1 << 20)):
            for _kind, body in (decode(m) for m in reader.feed(data)):
                finished.extend(row[0] for row in body[1] if row[2])
                if len(finished) == 8:
                    done.set()

    threads = [threading.Thread(target=f, daemon=True) for f in (loop.run, read_outputs)]
    for thread in threads:
        thread.start()
    try:
        peer.sendall(_add("r0"))
        assert done.wait(timeout=10), finished
    finally:
        peer.sendall(frame(encode(Msg.SHUTDOWN)))
        threads[0].join(timeout=10)
        channel.close()
        payloads.close()
        engine_end.close()
        threads[1].join(timeout=10)
        peer.close()
    assert engine.step_sizes[0] == 8, engine.step_sizes


class _Limits(EchoEngine):
    def __init__(self) -> None:
        super().__init__("thinker")
        self.limits: list[dict] = []

    def limit(self, limits) -> None:
        self.limits.append(dict(limits))


def test_limit_messages_reach_the_engine_and_malformed_ones_are_dropped(caplog):
    engine_end, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    engine, payloads = _Limits(), PayloadPlane("test-engine-loop-limit")
    channel = Channel(engine_end)
    loop = EngineLoop("thinker/0", engine, channel, payloads)
    try:
        loop._handle(encode(Msg.LIMIT, [["a", 3], ["b", None]]))
        loop._handle(encode(Msg.LIMIT, [["a"]]))  # not [id, limit] pairs
        loop._handle(encode(Msg.LIMIT, 5))
        loop._handle(encode(Msg.LIMIT, [["a", "3"]]))  # a limit is an integer or None
    finally:
        channel.close()
        payloads.close()
        engine_end.close()
        peer.close()
    assert engine.limits == [{"a": 3, "b": None}]
    assert caplog.text.count("dropping malformed LIMIT") == 3
