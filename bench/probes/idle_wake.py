"""What waking an idle peer costs: raw round trips with and without an idle gap.

A bare echo child answers a 60-byte message, one at a time, over a Unix stream socket
and over ZeroMQ (ROUTER here, DEALER there, ipc). With ``gap`` the client sleeps before
each send, so the child and its threads sit idle the way a stage of an N-stage pipeline
does while the other stages run. ZeroMQ rows also run with each side's libzmq I/O thread
pinned to the CPU its main thread is pinned to (``pin``): a hand-off between a process's
two threads then stays on one CPU. Prints medians (bench/probes/README.md).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import statistics
import sys
import time

import zmq

ROUNDS, WARMUP = 2000, 200


def _context(cpu: int | None) -> zmq.Context:
    context = zmq.Context(io_threads=1)
    if cpu is not None:  # before the first socket: that is when the I/O thread starts
        context.set(zmq.THREAD_AFFINITY_CPU_ADD, cpu)
        os.sched_setaffinity(0, {cpu})
    return context


def _zmq_echo(address: str, cpu: int | None) -> None:
    sock = _context(cpu).socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"e")
    sock.connect(address)
    sock.send(b"hi")
    while (message := sock.recv()) != b"q":
        sock.send(message)


def _unix_echo(path: str) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(path)
    while (message := sock.recv(4096)) not in (b"q", b""):
        sock.sendall(message)


def _rounds(send, receive, gap_s: float) -> float:  # noqa: ANN001 - two callables
    samples = []
    for i in range(ROUNDS):
        if gap_s:
            time.sleep(gap_s)
        t0 = time.perf_counter_ns()
        send(b"x" * 60)
        receive()
        if i >= WARMUP:
            samples.append((time.perf_counter_ns() - t0) / 1000)
    return statistics.median(samples)


def zmq_rtt(gap_s: float, pin: bool) -> float:
    cpus = sorted(os.sched_getaffinity(0))
    address = f"ipc:///tmp/omni-idle-wake-{os.getpid()}.sock"
    context = _context(cpus[0] if pin else None)
    router = context.socket(zmq.ROUTER)
    router.bind(address)
    child = mp.get_context("spawn").Process(target=_zmq_echo,
                                            args=(address, cpus[-1] if pin else None))
    child.start()
    router.recv_multipart()
    try:
        return _rounds(lambda m: router.send_multipart([b"e", m]), router.recv_multipart, gap_s)
    finally:
        router.send_multipart([b"e", b"q"])
        child.join()
        router.close(0)
        context.term()
        os.sched_setaffinity(0, cpus)


def unix_rtt(gap_s: float) -> float:
    path = f"/tmp/omni-idle-wake-{os.getpid()}-unix.sock"
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)
    child = mp.get_context("spawn").Process(target=_unix_echo, args=(path,))
    child.start()
    conn, _ = listener.accept()
    try:
        return _rounds(conn.sendall, lambda: conn.recv(4096), gap_s)
    finally:
        conn.sendall(b"q")
        child.join()
        conn.close()
        listener.close()
        os.unlink(path)


if __name__ == "__main__":
    gap_ms = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    for _ in range(2):
        for gap in (0.0, gap_ms / 1000):
            label = f"gap {gap * 1000:g} ms"
            print(f"{label}: unix {unix_rtt(gap):.1f} us, zmq {zmq_rtt(gap, False):.1f} us, "
                  f"zmq pinned {zmq_rtt(gap, True):.1f} us (round trip p50)", flush=True)
