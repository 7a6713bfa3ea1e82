"""EngineLoop (omni/engines/proc/loop.py): what arrives while an idle engine handles the
message that woke it runs in the same step, not a step later; an engine that gathers a
batch (Engine.gather_s) is not stepped until its gathering ends."""

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


def _serve(tmp_path, make_engine, burst: int, kick) -> list[str]:
    """Run an EngineLoop on the engine ``make_engine(send)`` makes, call ``kick(send)``,
    and return the ids of the ``burst`` requests that finished (within 10 s)."""
    address = f"ipc://{tmp_path}/control.sock"
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.bind(address)
    lock = threading.Lock()  # the router is used by this thread and the engine's

    def send(message: bytes) -> None:
        with lock:
            router.send_multipart([ENGINE, message])

    engine = make_engine(send)
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
        kick(send)
        deadline = time.monotonic() + 10
        while len(finished) < burst and time.monotonic() < deadline:
            with lock:
                ready = router.poll(20)
                message = router.recv_multipart()[1] if ready else None
            if message is not None:
                finished += [row.request_id for row in decode(message).rows if row.finished]
    finally:
        send(encode(Shutdown()))
        thread.join(timeout=10)
        channel.close()
        payloads.close()
        router.close(0)
        context.term()
    return finished


def test_a_burst_that_arrives_while_the_first_is_handled_runs_in_one_step(tmp_path):
    engines = []

    def make(send):
        engines.append(_BurstEcho(send, burst=8))
        return engines[0]

    finished = _serve(tmp_path, make, 8, lambda send: send(_add("r0")))
    assert len(finished) == 8, finished
    assert engines[0].step_sizes[0] == 8, engines[0].step_sizes


class _Gathering(EchoEngine):
    """Echo engine that gathers its first batch until no request has come for GAP_S
    (as the AR engine's media encoder does, omni/engines/ar/encoder.py)."""

    GAP_S = 0.1

    def __init__(self) -> None:
        super().__init__("thinker")
        self.last_add, self.step_sizes = 0.0, []

    def add(self, request) -> None:
        super().add(request)
        self.last_add = time.monotonic()

    def gather_s(self) -> float:
        if self.step_sizes:  # only the first batch gathers here
            return 0.0
        return max(0.0, self.last_add + self.GAP_S - time.monotonic())

    def step(self):
        self.step_sizes.append(sum(job.runnable() for job in self.jobs.values()))
        return super().step()


def test_an_engine_that_gathers_is_not_stepped_until_its_burst_is_in(tmp_path):
    """Requests that reach the engine spread out (each crosses the front end in turn)
    still run in one step: the loop waits on its socket while the engine gathers."""
    engine = _Gathering()

    def spread(send) -> None:
        for i in range(8):
            send(_add(f"r{i}"))
            time.sleep(0.02)  # stands in for the front end's work per request

    started = time.monotonic()
    finished = _serve(tmp_path, lambda send: engine, 8, spread)
    assert sorted(finished) == [f"r{i}" for i in range(8)], finished
    assert engine.step_sizes[0] == 8, engine.step_sizes
    assert time.monotonic() - started < 5  # the gathering ended without more input


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
