"""How a mooncake read should wait: the engine's synchronous read against an asynchronous
one polled with ``sched_yield``, with 50 us sleeps, or as omni's Engine.read does.

``python bench/probes/mooncake_wait.py [SIZES_KIB]``: a producer in a spawned child
publishes one payload per size over 127.0.0.1; this process reads it into one registered
buffer, each read after a round trip to the child (so the engines' threads are idle when
it starts, as between a consumer's gets), the ways taking turns read by read in a rotating
order, and prints p50 / mean / p99 per way, the
calling thread's CPU time per read and how many reads took longer than 4x the p50
(omni/connector/mooncake_engine.py cites it; bench/probes/README.md).
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

KiB = 1024
READS = {64 * KiB: 400, 1024 * KiB: 100, 8192 * KiB: 30, 65536 * KiB: 10}


def producer(conn, sizes: list[int]) -> None:  # noqa: ANN001 - a Pipe end
    import torch

    from omni.connector.mooncake import MooncakeConnector

    with MooncakeConnector("probe-p", capacity_bytes=2 * sum(sizes)) as made:
        conn.send({n: made.put(torch.randint(0, 255, (n,), dtype=torch.uint8),
                               owner="o").location for n in sizes})
        while conn.recv() != "stop":
            conn.send("pong")


def polled(te, buf, sleep_s: float | None):  # noqa: ANN001, ANN201 - engine, tensor
    def read(session: str, remote: int, n: int) -> int:
        batch = te.batch_transfer_async_read(session, [buf.data_ptr()], [remote], [n])
        while not (rc := te.transfer_check_status(batch)):
            os.sched_yield() if sleep_s is None else time.sleep(sleep_s)
        return 0 if rc == 1 else rc
    return read


def main(sizes: list[int]) -> None:
    import torch

    from omni.connector.mooncake_engine import DONE, Engine

    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=producer, args=(there, sizes), daemon=True)
    child.start()
    places = here.recv()
    engine = Engine("127.0.0.1", "tcp", "", 5.0)
    buf = torch.zeros(max(sizes), dtype=torch.uint8)
    engine.register(buf)
    te = engine.te
    ways = {"sync": lambda s, r, n: te.transfer_sync_read(s, buf.data_ptr(), r, n),
            "yield": polled(te, buf, None), "sleep50us": polled(te, buf, 50e-6),
            "omni": lambda s, r, n: engine.read(s, buf.data_ptr(), r, n) - DONE}
    try:
        for n in sizes:
            session, base, offset, _, _ = places[n]
            walls: dict[str, list[float]] = {w: [] for w in ways}
            cpus = dict.fromkeys(ways, 0.0)
            order = list(ways)
            for i in range(READS.get(n, 20)):  # the ways take turns in a rotating order
                for way in order[i % 4:] + order[:i % 4]:
                    read = ways[way]
                    here.send("ping")  # a round trip first: every thread on the way idles
                    here.recv()
                    t0, c0 = time.perf_counter(), time.thread_time()
                    assert read(session, base + offset, n) == 0
                    walls[way].append(time.perf_counter() - t0)
                    cpus[way] += time.thread_time() - c0
            for way, samples in walls.items():
                s = sorted(samples)
                p50 = s[len(s) // 2]
                print(f"{n // KiB:>6} KiB {way:9} p50 {p50 * 1e6:8.0f} us  mean "
                      f"{statistics.fmean(s) * 1e6:8.0f} us  p99 {s[int(0.99 * len(s))] * 1e6:8.0f}"
                      f" us  cpu/read {cpus[way] / len(s) * 1e6:7.0f} us  "
                      f">4x p50: {sum(x > 4 * p50 for x in s)}/{len(s)}", flush=True)
    finally:
        here.send("stop")
        child.join(30)
        engine.shutdown()


if __name__ == "__main__":
    main([int(s) * KiB for s in sys.argv[1].split(",")] if len(sys.argv) > 1 else list(READS))
