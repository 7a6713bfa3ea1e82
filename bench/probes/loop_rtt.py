"""A ROUTER <-> DEALER echo round trip, the ROUTER read three ways (bench/probes/README.md)."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import statistics
import time

import uvloop
import zmq

ROUNDS, WARMUP, BUSY_NS = 3000, 300, 60_000


def _echo(address: str) -> None:
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"e")
    sock.connect(address)
    sock.send(b"hi")
    while (message := sock.recv()) != b"q":
        sock.send(message)


def _poll(router: zmq.Socket) -> list[float]:
    poller, rtts = zmq.Poller(), []
    poller.register(router, zmq.POLLIN)
    for i in range(ROUNDS):
        t0 = time.perf_counter_ns()
        router.send_multipart([b"e", b"x" * 60])
        poller.poll()
        router.recv_multipart()
        if i >= WARMUP:
            rtts.append((time.perf_counter_ns() - t0) / 1000)
    return rtts


async def _uvloop(router: zmq.Socket, busy: bool) -> list[float]:
    loop, box, rtts = asyncio.get_running_loop(), {}, []

    def readable() -> None:
        while router.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            router.recv_multipart()
            box["reply"].set_result(None)

    fd = router.getsockopt(zmq.FD)
    loop.add_reader(fd, readable)
    for i in range(ROUNDS):
        box["reply"] = loop.create_future()
        t0 = time.perf_counter_ns()
        router.send_multipart([b"e", b"x" * 60])
        if router.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            loop.call_soon(readable)
        end = time.perf_counter_ns() + (BUSY_NS if busy else 0)
        while time.perf_counter_ns() < end:
            pass
        await box["reply"]
        if i >= WARMUP:
            rtts.append((time.perf_counter_ns() - t0) / 1000)
    loop.remove_reader(fd)
    return rtts


def run(mode: str) -> float:
    address = f"ipc:///tmp/omni-probe-{mode}.sock"
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.bind(address)
    child = mp.get_context("spawn").Process(target=_echo, args=(address,))
    child.start()
    router.recv_multipart()
    rtts = _poll(router) if mode == "poll" else uvloop.run(_uvloop(router, mode == "uvloop-busy"))
    router.send_multipart([b"e", b"q"])
    child.join()
    router.close(0)
    context.term()
    return statistics.median(rtts)


if __name__ == "__main__":
    for _ in range(3):
        for mode in ("poll", "uvloop", "uvloop-busy"):
            print(f"{mode}: rtt p50 {run(mode):.1f} us", flush=True)
