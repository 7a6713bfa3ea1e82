"""Shared-memory connector throughput: one tensor from a producer to a consumer process.

``python -m bench.shm_throughput [--sizes 4K,64K,1M,16M,64M,256M] [--out bench/results]``

Measured per payload size, one payload in flight, producer = this process, consumer = one
spawned process, refs/names over a multiprocessing Pipe (msgpack bytes):

  memcpy  baseline, one process: ``dst.copy_(src)`` into a preallocated, pre-touched tensor.
  ours    ``ShmConnector.put(src)`` (copy into the pre-faulted arena) -> ref over the pipe
          -> consumer ``get()`` (zero-copy view) -> ``dst.copy_(view)`` into a preallocated
          tensor -> ``release()``. Time from put start to the consumer's copy done.
          Two copies of the bytes (in, out), so its ceiling is ~50% of memcpy.
  ours-view  as ours, but the consumer uses the view in place (reads its last element)
          instead of copying it out: one copy (put). What a consumer that computes on the
          payload directly pays.
  fresh   a new SharedMemory segment per payload (what vLLM-Omni does): create, copy in,
          name over the pipe, consumer attaches, ``dst.copy_``, closes and unlinks.

GB/s = payload bytes / median time (1 GB = 1e9 bytes). Target: ours >= 70% of memcpy at
64 MiB. Writes shm.md and shm.json under --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import multiprocessing
import os
import platform
import shlex
import statistics
import sys
import time
import uuid
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path
from typing import Any

os.environ["OMP_NUM_THREADS"] = "1"  # before torch; the spawned consumer inherits it

import msgpack  # noqa: E402
import torch  # noqa: E402

from omni.connector import PayloadRef, ShmConnector, cleanup_stale  # noqa: E402
from omni.connector.shm_segment import DEFAULT_BLOCK_SIZE, _attach  # noqa: E402

DESCRIPTION = __doc__
DEFAULT_SIZES = "4K,64K,1M,16M,64M,256M"
ROWS = ("memcpy", "ours", "ours-view", "fresh")
TARGET_RATIO = 0.70
TARGET_SIZE = 64 * 1024 * 1024


def _size(text: str) -> int:
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * mult)


def _sizes(text: str) -> list[int]:
    return [_size(t) for t in text.split(",") if t.strip()]


def _label(n: int) -> str:
    for unit, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= mult and n % mult == 0:
            return f"{n // mult} {unit}"
    return f"{n} B"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default=DEFAULT_SIZES, type=_sizes, metavar="S,S,...",
                        help=f"payload sizes, K/M/G suffixes (default {DEFAULT_SIZES})")
    parser.add_argument("--bytes-per-row", default="1G", type=_size, metavar="BYTES",
                        help="bytes moved per row and size; sets the iteration count "
                             "(default 1G, clamped to --min-iters..--max-iters)")
    parser.add_argument("--min-iters", type=int, default=5)
    parser.add_argument("--max-iters", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=2, help="dropped iterations per row")
    parser.add_argument("--block-size", default=str(DEFAULT_BLOCK_SIZE), type=_size)
    parser.add_argument("--out", default="bench/results", type=Path)


# -- consumer process ---------------------------------------------------------------------

def _send(conn: Any, obj: Any) -> None:
    conn.send_bytes(msgpack.packb(obj, use_bin_type=True))


def _recv(conn: Any) -> Any:
    return msgpack.unpackb(conn.recv_bytes(), raw=False)


def consumer_main(conn: Any, prefix: str) -> None:
    torch.set_num_threads(1)
    consumer = ShmConnector(prefix + "-consumer")
    dst = torch.empty(0, dtype=torch.uint8)
    try:
        while True:
            msg = _recv(conn)
            op = msg[0]
            if op == "stop":
                break
            if op == "size":  # preallocate and touch the destination outside the timing
                dst = torch.zeros(msg[1], dtype=torch.uint8)
                _send(conn, 0)
            elif op == "ours":
                ref = PayloadRef.from_wire(msg[1])
                dst.copy_(consumer.get(ref))
                consumer.release(ref)
                _send(conn, time.perf_counter_ns())
            elif op == "view":
                ref = PayloadRef.from_wire(msg[1])
                view = consumer.get(ref)
                int(view[-1])  # use it: one read, the payload is ready in place
                del view
                consumer.release(ref)
                _send(conn, time.perf_counter_ns())
            elif op == "fresh":  # attach (no resource-tracker registration), copy, unlink
                shm = _attach(msg[1])
                dst.copy_(torch.frombuffer(shm.buf, dtype=torch.uint8, count=msg[2]))
                shm.close()
                os.unlink(f"/dev/shm/{msg[1]}")
                _send(conn, time.perf_counter_ns())
    finally:
        consumer.close()


# -- producer (this process) ---------------------------------------------------------------

def _iters(size: int, args: argparse.Namespace) -> int:
    return max(args.min_iters, min(args.max_iters, math.ceil(args.bytes_per_row / size)))


def _summary(size: int, ns: list[int]) -> dict[str, Any]:
    med = statistics.median(ns)
    return {"iters": len(ns), "median_us": round(med / 1e3, 2),
            "min_us": round(min(ns) / 1e3, 2), "max_us": round(max(ns) / 1e3, 2),
            "gbps": round(size / med, 3), "best_gbps": round(size / min(ns), 3),
            "samples_us": [round(x / 1e3, 1) for x in ns]}


def measure(size: int, args: argparse.Namespace, conn: Any, producer: ShmConnector,
            prefix: str) -> dict[str, Any]:
    n, warm = _iters(size, args), args.warmup
    src = torch.zeros(size, dtype=torch.uint8)
    dst = torch.zeros(size, dtype=torch.uint8)
    _send(conn, ["size", size])
    _recv(conn)
    out: dict[str, Any] = {"size": size, "iters": n}

    samples = []
    for i in range(n + warm):
        src[0] = i % 251  # distinct payloads, no full rewrite (that would warm the cache)
        t0 = time.perf_counter_ns()
        dst.copy_(src)
        samples.append(time.perf_counter_ns() - t0)
    out["memcpy"] = _summary(size, samples[warm:])

    for row, op in (("ours", "ours"), ("ours-view", "view")):
        samples = []
        for i in range(n + warm):
            src[0] = i % 251
            t0 = time.perf_counter_ns()
            ref = producer.put(src, owner=f"b{i}")
            _send(conn, [op, ref.to_wire()])
            samples.append(_recv(conn) - t0)
        out[row] = _summary(size, samples[warm:])

    samples = []
    for i in range(n + warm):
        src[0] = i % 251
        t0 = time.perf_counter_ns()
        name = f"{prefix}-fresh-{i}"
        # track=False semantics by hand: the consumer unlinks, so nobody should track it
        shm = shared_memory.SharedMemory(name=name, create=True, size=size)
        resource_tracker.unregister(shm._name, "shared_memory")
        torch.frombuffer(shm.buf, dtype=torch.uint8, count=size).copy_(src)
        _send(conn, ["fresh", name, size])
        done = _recv(conn)
        samples.append(done - t0)
        shm.close()  # after the timing: the producer's unmap is off the critical path
    out["fresh"] = _summary(size, samples[warm:])
    for row in ("ours", "ours-view", "fresh"):
        out[row]["ratio_vs_memcpy"] = round(out[row]["gbps"] / out["memcpy"]["gbps"], 3)
    return out


def hardware() -> dict[str, Any]:
    try:
        from bench.common import _lscpu
        cpu = _lscpu()
    except Exception:  # noqa: BLE001
        cpu = {}
    ram = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    ram = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    import numpy
    return {"cpu_model": cpu.get("Model name", platform.processor() or "unknown"),
            "hypervisor": cpu.get("Hypervisor vendor"), "cores": os.cpu_count(),
            "ram_gib": ram, "os": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "numpy": numpy.__version__,
            "msgpack": ".".join(map(str, msgpack.version)),
            "shm_fs": _shm_fs(), "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}


def _shm_fs() -> str:
    try:
        st = os.statvfs("/dev/shm")
        return f"/dev/shm {st.f_blocks * st.f_frsize / 2**30:.1f} GiB"
    except OSError:
        return "no /dev/shm"


def run(args: argparse.Namespace, argv: list[str]) -> int:
    torch.set_num_threads(1)
    prefix = f"omni-bench-{uuid.uuid4().hex[:8]}"
    result: dict[str, Any] = {
        "command": " ".join(["python -m bench.shm_throughput", *map(shlex.quote, argv)]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "hardware": hardware(), "block_size": args.block_size, "sizes": []}
    started = time.monotonic()
    producer = ShmConnector(prefix, capacity_bytes=max(args.sizes), block_size=args.block_size)
    t0 = time.perf_counter()
    producer.open_arena()
    result["arena_create_s"] = round(time.perf_counter() - t0, 3)
    ctx = multiprocessing.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    process = ctx.Process(target=consumer_main, args=(child_conn, prefix), daemon=True)
    process.start()
    child_conn.close()
    try:
        for size in args.sizes:
            row = measure(size, args, conn, producer, prefix)
            result["sizes"].append(row)
            print(f"{_label(size):>8}: " + "  ".join(
                f"{name} {row[name]['gbps']:.2f} GB/s" for name in ROWS), file=sys.stderr,
                flush=True)
        _send(conn, ["stop"])
        process.join(30)
    finally:
        if process.is_alive():
            process.kill()
            process.join(5)
        producer.close()
        cleanup_stale(prefix)
    result["wall_s"] = round(time.monotonic() - started, 1)
    result["hardware"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "shm.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "shm.md").write_text(render(result))
    print(f"wrote {args.out / 'shm.md'} and {args.out / 'shm.json'}", file=sys.stderr)
    return 0


def render(r: dict[str, Any]) -> str:
    hw = r["hardware"]
    lines = [
        "# Shared-memory connector throughput", "",
        f"Date: {r['date']}  ",
        f"Command: `{r['command']}` (wall {r['wall_s']} s)", "",
        "## Machine", "",
        f"- CPU: {hw['cpu_model']}, {hw['cores']} cores"
        + (f", {hw['hypervisor']} VM" if hw.get("hypervisor") else "") + f", RAM {hw['ram_gib']} GiB",
        f"- {hw['os']}; {hw['shm_fs']}; load average at start {hw['loadavg_at_start']}, at end "
        f"{hw['loadavg_at_end']}",
        f"- Python {hw['python']}, torch {hw['torch']}, numpy {hw['numpy']}, msgpack "
        f"{hw['msgpack']}; OMP_NUM_THREADS=1, torch.set_num_threads(1) in both processes",
        f"- arena: block size {_label(r['block_size'])}, capacity = largest size, created and "
        f"pre-faulted in {r['arena_create_s']} s (once, outside the timings)", "",
        "## What is measured", "",
        "One payload in flight; producer = the bench process, consumer = one spawned process; "
        "refs / segment names over a `multiprocessing.Pipe` (msgpack bytes); time = "
        "`perf_counter_ns` (CLOCK_MONOTONIC, same clock in both processes) from the start of "
        "the producer's work to the consumer having a usable tensor. \"Usable\" = copied into a "
        "preallocated, pre-touched `dst` with `dst.copy_(view)`; the memcpy baseline is that "
        "same single `dst.copy_(src)` in one process.", "",
        "- **memcpy**: `dst.copy_(src)`, one process, no IPC.",
        "- **ours**: `ShmConnector.put(src)` (copy into the arena) -> ref over the pipe -> "
        "`get()` (zero-copy view) -> `dst.copy_(view)` -> `release()` (one flag byte). "
        "The bytes are copied twice (into the arena, out of it), so ~50% of memcpy is the "
        "ceiling for this row.",
        "- **ours-view**: as ours, but the consumer uses the view in place (one element read) "
        "instead of copying it out: one copy. This is what a consumer that computes on the "
        "payload directly (or a producer that writes in place with `reserve()` and a consumer "
        "that copies) pays.",
        "- **fresh**: a new `SharedMemory` segment per payload (vLLM-Omni's way): create, copy "
        "in (first-touch page faults), name over the pipe, consumer attaches, `dst.copy_`, "
        "closes and unlinks. The producer's own unmap is after the timing.", "",
        "GB/s = bytes / median time (1 GB = 10^9 B); ratio = row GB/s / memcpy GB/s.", "",
        "## Results", "",
        "| size | iters | memcpy GB/s | ours GB/s | ours/memcpy | ours-view GB/s | "
        "view/memcpy | fresh GB/s | fresh/memcpy | ours median us | fresh median us |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in r["sizes"]:
        lines.append(
            f"| {_label(s['size'])} | {s['iters']} | {s['memcpy']['gbps']:.2f} | "
            f"{s['ours']['gbps']:.2f} | {s['ours']['ratio_vs_memcpy']:.0%} | "
            f"{s['ours-view']['gbps']:.2f} | {s['ours-view']['ratio_vs_memcpy']:.0%} | "
            f"{s['fresh']['gbps']:.2f} | {s['fresh']['ratio_vs_memcpy']:.0%} | "
            f"{s['ours']['median_us']:.1f} | {s['fresh']['median_us']:.1f} |")
    at = next((s for s in r["sizes"] if s["size"] == TARGET_SIZE), None)
    lines += ["", "## Reading", ""]
    if at:
        ours, view = at["ours"]["ratio_vs_memcpy"], at["ours-view"]["ratio_vs_memcpy"]
        lines.append(
            f"- At 64 MiB: ours {ours:.0%} of memcpy (target {TARGET_RATIO:.0%}: "
            f"{'met' if ours >= TARGET_RATIO else 'NOT met'}); ours-view {view:.0%} "
            f"({'met' if view >= TARGET_RATIO else 'not met'}). ours moves the bytes twice, "
            f"so its ratio is bounded by ~50% by construction; the one-copy path "
            f"(ours-view) is the one to hold against the target. fresh is "
            f"{at['ours']['gbps'] / at['fresh']['gbps']:.1f}x slower than ours.")
    small = r["sizes"][0]
    lines.append(
        f"- Small payloads ({_label(small['size'])}): ours {small['ours']['median_us']:.0f} us "
        f"per transfer, dominated by the pipe round trip (process wake-ups), not by bytes; "
        f"the `auto` connector sends payloads below 64 KiB inline in the control message.")
    lines.append("- Raw samples per row are in shm.json (`samples_us`, arrival order).")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.shm_throughput",
                                     description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    argv = sys.argv[1:] if argv is None else argv
    return run(parser.parse_args(argv), argv)


if __name__ == "__main__":
    sys.exit(main())
