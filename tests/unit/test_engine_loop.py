"""EngineLoop (omni/engines/proc/loop.py): what arrives while an idle engine handles the
message that woke it runs in the same step, not a step later."""

from __future__ import annotations

import threading
import time

import zmq

from omni.engines.echo.engine import EchoEngine
from omni.engines.proc import EngineLoop
from omni.engines.proc.channel import Channel
from omni.wire.payloads import PayloadPlane
from omni.wire.protocol import Add, Limit, Ready, Shutdown, decode, encode, identity

ENGINE = b"code2wav/0@0"


class _BurstEcho(EchoEngine):
    """Echo engine that records how many requests each step runs; adding the first
    request sends the rest of the burst (as an orchestrator finishing a batch upstream
    does, one Add each, while the engine is still handling the first), and takes a
    while to add it, so the burst has arrived when it is done."""

    def __init__(self, send, burst: int) -> None:
        super().__init__("code2wav")
        self.send, self.burst, self.step_sizes = send, burst, []

    def add(self, request) -> None:
        super().add(request)
        if request.request_id == "r0":
            for i in range(1, self.burst):
                self.send(_add(f"r{i}"))
            time.sleep(0.2)

    def step(self):
        self.step_sizes.append(sum(job.runnable() for job in self.jobs.values()))
        return super().step()


def _add(rid: str) -> bytes:
    return encode(Add(rid, {"prompt": "hello"}, {}, time.monotonic()))


def test_a_burst_that_arrives_while_the_first_is_handled_runs_in_one_step(tmp_path):
    address = f"ipc://{tmp_path}/control.sock"
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.bind(address)
    lock = threading.Lock()  # the router is used by this thread and the engine's

    def send(message: bytes) -> None:
        with lock:
            router.send_multipart([ENGINE, message])

    engine = _BurstEcho(send, burst=8)
    channel = Channel(address, identity("code2wav/0", 0), "code2wav/0")
    channel.send(encode(Ready("code2wav/0", {})))
    assert router.poll(5000)
    router.recv_multipart()  # Ready: the router can address the engine now
    payloads = PayloadPlane("test-engine-loop")
    loop = EngineLoop("code2wav/0", engine, channel, payloads)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    finished: list[str] = []
    try:
        send(_add("r0"))
        deadline = time.monotonic() + 10
        while len(finished) < 8 and time.monotonic() < deadline:
            with lock:
                ready = router.poll(20)
                message = router.recv_multipart()[1] if ready else None
            if message is not None:
                finished += [row.request_id for row in decode(message).rows if row.finished]
        assert len(finished) == 8, finished
    finally:
        send(encode(Shutdown()))
        thread.join(timeout=10)
        channel.close()
        payloads.close()
        router.close(0)
        context.term()
    assert engine.step_sizes[0] == 8, engine.step_sizes


class _Limits(EchoEngine):
    def __init__(self) -> None:
        super().__init__("thinker")
        self.limits: list[dict] = []

    def limit(self, limits) -> None:
        self.limits.append(dict(limits))


def test_limit_messages_reach_the_engine_and_malformed_ones_are_dropped(caplog, tmp_path):
    engine, payloads = _Limits(), PayloadPlane("test-engine-loop-limit")
    channel = Channel(f"ipc://{tmp_path}/control.sock", b"thinker/0@0", "thinker/0")
    loop = EngineLoop("thinker/0", engine, channel, payloads)
    try:
        loop._handle(encode(Limit({"a": 3, "b": None})))
        # encode writes what it is given; the engine's decode checks the types
        loop._handle(encode(Limit([["a"]])))  # not a map of id -> limit
        loop._handle(encode(Limit(5)))
        loop._handle(encode(Limit({"a": "3"})))  # a limit is an integer or None
        loop._handle(encode(Limit({"a": True})))
    finally:
        channel.close()
        payloads.close()
    assert engine.limits == [{"a": 3, "b": None}]
    assert caplog.text.count("dropping malformed message from orchestrator") == 4
