"""CUDA IPC handoff latency: one GPU tensor from a producer process to a consumer process.

``python -m bench.cuda_ipc [--sizes 1M,16M,64M,256M,1G] [--iters 50] [--warmup 5] --out DIR``

Producer = this process (holds a filled uint8 CUDA tensor of the size), consumer = one
spawned process; refs and replies over a ``multiprocessing.Pipe`` (msgpack bytes). Time =
``perf_counter_ns`` (CLOCK_MONOTONIC, one clock for both processes) from the start of the
producer's work to the consumer holding a usable device tensor: its ``get()`` returned and
a trivial kernel read it (sum of the first element, ``.item()`` synchronizes). Rows:

  put-stream   ``CudaIpcConnector(sync="stream").put(src)``: D2D copy into the pool, stream
               synchronize, ref over the pipe, consumer ``get()`` (zero-copy view), read.
  put-event    the same with ``sync="event"``: the copy runs on the producer's private
               stream, one interprocess event is recorded, the consumer's stream waits on it.
  reserve      zero copy: ``reserve()`` + ``fill_`` of the view in place (stands for the
               producer's own kernel writing its output) + ``ready()``, ref, get, read.
  pinned-host  baseline: D2H copy of src into pinned host memory shared with the consumer
               (a memfd mapped and cudaHostRegister'ed in both), synchronize, size over the
               pipe, consumer H2D copy into a preallocated device tensor, read.
  d2d-copy     reference floor, one process: ``dst.copy_(src)`` + synchronize (no IPC).

The consumer releases each ref after taking its timestamp (not timed); the producer's next
put reclaims the blocks. Every reply carries the value read, checked against what the
producer wrote that iteration. Target: <= 1 ms at every size. Writes cuda_ipc.md/.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import mmap
import multiprocessing
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from multiprocessing import reduction
from pathlib import Path
from typing import Any

import msgpack
import torch

from omni.connector import CudaIpcConnector, PayloadRef

DESCRIPTION = __doc__
DEFAULT_SIZES = "1M,16M,64M,256M,1G"
IPC_ROWS = ("put-stream", "put-event", "reserve")
ROWS = (*IPC_ROWS, "pinned-host", "d2d-copy")
TARGET_US = 1000.0
BLOCK = 2 << 20


def _size(text: str) -> int:
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * mult)


def _label(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


def _register(t: torch.Tensor) -> bool:
    err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel(), 0)
    return int(getattr(err, "value", err)) == 0


def _consumer(conn: Any, max_size: int) -> None:
    """Spawned consumer: get/read/release refs, or H2D-copy from the shared pinned buffer."""
    torch.cuda.init()
    fd = reduction.recv_handle(conn)
    mm = mmap.mmap(fd, max_size)
    os.close(fd)
    host = torch.frombuffer(mm, dtype=torch.uint8)
    pinned = _register(host)
    dst = torch.empty(max_size, dtype=torch.uint8, device="cuda")
    cons = CudaIpcConnector(f"omni-bench-cons-{os.getpid()}")
    conn.send_bytes(_pack(["ready", pinned]))
    try:
        while True:
            msg = _unpack(conn.recv_bytes())
            if msg[0] == "stop":
                break
            if msg[0] == "ipc":
                ref = PayloadRef.from_wire(msg[1])
                view = cons.get(ref)
                value = int(view.reshape(-1)[:1].sum().item())
                t1 = time.perf_counter_ns()
                cons.release(ref)
            else:  # "pin": n bytes wait in the pinned buffer
                n = msg[1]
                dst[:n].copy_(host[:n], non_blocking=True)
                value = int(dst[:1].sum().item())
                t1 = time.perf_counter_ns()
            conn.send_bytes(_pack([t1, value]))
    finally:
        cons.close()
        del host
        conn.close()


def _send(row: str, conn: CudaIpcConnector | None, pipe: Any, src: torch.Tensor,
          host: torch.Tensor, n: int, i: int, val: int) -> None:
    """The producer's side of one timed handoff (everything up to the pipe send)."""
    if row == "reserve":
        ref, view = conn.reserve((n,), torch.uint8, owner=f"i{i}")
        view.fill_(val)  # stands for the producer's kernel writing its output in place
        conn.ready()
        pipe.send_bytes(_pack(["ipc", ref.to_wire()]))
    elif row == "pinned-host":
        host[:n].copy_(src[:n], non_blocking=True)
        torch.cuda.current_stream().synchronize()
        pipe.send_bytes(_pack(["pin", n]))
    else:  # put-stream, put-event
        ref = conn.put(src[:n], owner=f"i{i}")
        pipe.send_bytes(_pack(["ipc", ref.to_wire()]))


def _percentile(samples: list[float], q: float) -> float:
    s = sorted(samples)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _gpu_info() -> dict[str, Any]:
    info: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0),
                            "gpu_count": torch.cuda.device_count(),
                            "torch": torch.__version__, "cuda": torch.version.cuda,
                            "python": platform.python_version(), "platform": platform.platform()}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20, check=True).stdout.strip().splitlines()[0]
        info["driver"], info["gpu_memory"] = [p.strip() for p in out.split(",")]
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        info["driver"] = "unknown (nvidia-smi unavailable)"
    return info


def run(sizes: list[int], iters: int, warmup: int) -> dict[str, Any]:
    max_size = max(sizes)
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_consumer, args=(child, max_size), daemon=True)
    proc.start()
    child.close()
    fd = os.memfd_create("omni-bench-pinned")
    os.ftruncate(fd, max_size)
    mm = mmap.mmap(fd, max_size)
    reduction.send_handle(parent, fd, proc.pid)
    os.close(fd)
    host = torch.frombuffer(mm, dtype=torch.uint8)
    t_reg = time.perf_counter()
    pinned = _register(host)
    reg_s = time.perf_counter() - t_reg
    ready = _unpack(parent.recv_bytes())
    src = torch.randint(0, 255, (max_size,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    torch.cuda.synchronize()
    results: dict[str, dict[str, Any]] = {}
    mismatches = 0

    try:
        for row in ROWS:
            conn = None
            if row in IPC_ROWS:
                conn = CudaIpcConnector(f"omni-bench-{os.getpid()}-{row}",
                                        capacity_bytes=max_size + 8 * BLOCK, block_size=BLOCK,
                                        sync="event" if row == "put-event" else "stream")
            for n in sizes:
                samples, first_us = [], None
                for i in range(warmup + iters):
                    val = i % 200 + 1
                    src[:1].fill_(val)
                    torch.cuda.synchronize()
                    if row == "d2d-copy":
                        t0 = time.perf_counter_ns()
                        dst[:n].copy_(src[:n])
                        value = int(dst[:1].sum().item())
                        ns = time.perf_counter_ns() - t0
                    else:
                        t0 = time.perf_counter_ns()
                        _send(row, conn, parent, src, host, n, i, val)
                        t1, value = _unpack(parent.recv_bytes())
                        ns = t1 - t0
                    mismatches += value != val
                    if i == 0:
                        first_us = ns / 1e3
                    if i >= warmup:
                        samples.append(ns / 1e3)
                results.setdefault(row, {})[str(n)] = {
                    "size": n, "iters": iters, "p50_us": _percentile(samples, 0.5),
                    "p99_us": _percentile(samples, 0.99), "mean_us": statistics.fmean(samples),
                    "min_us": min(samples), "max_us": max(samples), "first_us": first_us,
                    "samples_us": [round(s, 1) for s in samples]}
                print(f"{row:12s} {_label(n):>8s} p50 {results[row][str(n)]['p50_us']:9.1f} us"
                      f"  p99 {results[row][str(n)]['p99_us']:9.1f} us", flush=True)
            if conn is not None:
                health = conn.health()
                results[row]["_health"] = {k: health[k] for k in (
                    "puts", "reclaimed", "payloads_in_use", "full_waits", "capacity_bytes")}
                conn.close()
    finally:
        parent.send_bytes(_pack(["stop"]))
        proc.join(60)
        if proc.is_alive():
            proc.kill()
        torch.cuda.cudart().cudaHostUnregister(host.data_ptr())
    return {"results": results, "mismatches": mismatches, "pinned_producer": pinned,
            "pinned_consumer": bool(ready[1]), "host_register_s": reg_s}


def _report(data: dict[str, Any], sizes: list[int]) -> str:
    info, res = data["machine"], data["results"]
    lines = [
        "# CUDA IPC connector: handoff latency", "",
        f"Date: {data['date']}  ",
        f"Command: `{data['command']}` (wall {data['wall_s']:.1f} s)", "",
        "## Machine", "",
        f"- GPU: {info['gpu']} ({info.get('gpu_memory', '?')}), {info['gpu_count']} visible; "
        f"driver {info['driver']}",
        f"- torch {info['torch']} (CUDA {info['cuda']}), Python {info['python']}, "
        f"{info['platform']}",
        f"- pinned host buffer (memfd, cudaHostRegister): producer "
        f"{'pinned' if data['pinned_producer'] else 'NOT pinned'}, consumer "
        f"{'pinned' if data['pinned_consumer'] else 'NOT pinned'} "
        f"(registering {_label(max(sizes))} took {data['host_register_s']:.2f} s, once)",
        f"- pool: block {_label(BLOCK)}, capacity = largest size + 8 blocks; "
        f"{data['iters']} timed iterations after {data['warmup']} warm-up ones per cell", "",
        "## What is measured", "",
        "```", DESCRIPTION.split("Rows:", 1)[1].split("The consumer releases")[0].strip("\n"),
        "```", "",
        "Time: `perf_counter_ns` (CLOCK_MONOTONIC, shared by both processes) from the start of "
        "the producer's work to the consumer's `.item()` on the first element returning; the "
        "ref or size travels over a `multiprocessing.Pipe` as msgpack bytes (included). "
        "Target: <= 1 ms at every size.", "",
        "## Results (microseconds)", "",
        "| size | " + " | ".join(f"{r} p50 | {r} p99" for r in ROWS) + " |",
        "|---|" + "---:|" * (2 * len(ROWS)),
    ]
    for n in sizes:
        cells = []
        for row in ROWS:
            cell = res[row][str(n)]
            cells += [f"{cell['p50_us']:.1f}", f"{cell['p99_us']:.1f}"]
        lines.append(f"| {_label(n)} | " + " | ".join(cells) + " |")
    lines += ["", "## Reading", ""]
    for row in (*IPC_ROWS, "pinned-host"):
        worst = max(res[row][str(n)]["p99_us"] for n in sizes)
        met = [n for n in sizes if res[row][str(n)]["p50_us"] <= TARGET_US]
        lines.append(f"- {row}: p50 <= 1 ms at {len(met)}/{len(sizes)} sizes "
                     f"({', '.join(_label(n) for n in met) or 'none'}); worst p99 "
                     f"{worst:.1f} us.")
    big = str(max(sizes))
    lines += [
        f"- At {_label(max(sizes))}: put-stream {res['put-stream'][big]['p50_us']:.0f} us vs "
        f"pinned-host {res['pinned-host'][big]['p50_us']:.0f} us "
        f"({res['pinned-host'][big]['p50_us'] / res['put-stream'][big]['p50_us']:.1f}x); "
        f"the in-process D2D copy alone takes {res['d2d-copy'][big]['p50_us']:.0f} us.",
        f"- Value checks: {data['mismatches']} mismatches over all handoffs.",
        "- First (cold) handoff per cell is in cuda_ipc.json (`first_us`): the consumer opens "
        "the pool once per producer (cudaIpcOpenMemHandle).",
        "- Raw samples per cell are in cuda_ipc.json (`samples_us`, arrival order).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cuda_ipc", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=DEFAULT_SIZES)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.cuda_ipc needs a CUDA GPU", file=sys.stderr)
        return 2
    sizes = [_size(s) for s in args.sizes.split(",") if s.strip()]
    started = time.perf_counter()
    data = run(sizes, args.iters, args.warmup)
    data.update(
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        command="python -m bench.cuda_ipc " + shlex.join(argv if argv is not None
                                                         else sys.argv[1:]),
        wall_s=time.perf_counter() - started, iters=args.iters, warmup=args.warmup,
        sizes=sizes, machine=_gpu_info())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_ipc.json").write_text(json.dumps(data, indent=1))
    (out / "cuda_ipc.md").write_text(_report(data, sizes))
    print((out / "cuda_ipc.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
