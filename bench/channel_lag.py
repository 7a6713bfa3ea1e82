"""How long a stream of stream-edge inputs waits to reach an engine that is busy stepping.

``python -m bench.channel_lag [--rows 32] [--row-bytes 8200] [--producer-step-ms 14.6]
[--consumer-step-ms 44,20] [--step-kinds sleep,spin] [--seconds 8]``

The successor of the Unix-socket channel's drainer measurement (its last run is in the
git history of bench/results/channel-lag.md): the control plane is ZeroMQ now, and the
engine's libzmq I/O thread receives while the engine steps. The rates are the H200 run's,
bench/results/archive/omni-h200-c32-stream.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import hardware, percentile, say
from omni.wire.protocol import Append, Ready, Shutdown, decode, encode, identity, ipc_address

REPLICA_ID = "talker/0"
READY_TIMEOUT_S = 60.0

METHOD = """As between the orchestrator and an engine process, in two processes. The sender
is omni's own ROUTER (omni/runtime/control.py's ControlRouter, on uvloop's reader, as the
orchestrator runs it): every producer step (the upstream stage's step) it sends `rows`
APPEND messages (`omni.wire.protocol.encode`, one per request, `row_bytes` of data each: one
hidden-state row per request for the talker), each stamped with its send time
(time.monotonic(), one clock for every process of a host), then sleeps until the next
producer step (on a fixed schedule: round k starts k producer steps after the first). The
receiver, a spawned process, is the engine's Channel
(omni/engines/proc/channel.py, a DEALER named talker/0@0) in EngineLoop's pattern while the
engine has work: take every queued message without blocking, then a "step", again and
again. A `sleep` step waits like a GPU step that waits on the device (the GIL is free); a
`spin` step keeps the main thread busy in Python like a CPU step. Lag = the time from a
message's send to its return by receive(); the *last input* is the final APPEND before
SHUTDOWN: whatever came before it, it should wait at most one consumer step (it arrives
during a step and is read when that step ends), i.e. nothing queues up behind the steps.

The defaults are the H200 rates of bench/results/archive/omni-h200-c32-stream.md: 32
requests, a thinker step of 14.6 ms, a talker step of 44 ms, 8 KiB rows (2 hidden layers x
2048 x bf16); 20 ms is a shorter step beside it. `offered` is the bytes per second the
sender sends (whole messages); `delivered` what the receiver got per second, from the
first send to the last receipt. `send round` is the longest time the sender took to queue
one step's messages (it never waits on the receiver: a send past the high-water mark
would raise, not block)."""


def _receiver(address: str, kind: str, step_s: float, out: Any) -> None:
    """The engine's side: a Channel, read between steps; the lags go back through `out`."""
    from omni.engines.proc.channel import Channel

    channel = Channel(address, identity(REPLICA_ID, 0), REPLICA_ID)
    channel.send(encode(Ready(REPLICA_ID, {"engine": "channel_lag"})))
    lags: list[float] = []
    batch_max, steps, last_lag, last_at, nbytes = 0, 0, None, 0.0, 0
    done = False
    while not done:
        messages = channel.receive(block=not lags)  # idle until the stream starts
        now = time.monotonic()
        batch_max = max(batch_max, len(messages))
        for message in messages:
            command = decode(message)
            if isinstance(command, Shutdown):
                done = True
                break
            last_lag, last_at = now - command.sent_at, now  # an Append
            lags.append(last_lag)
            nbytes += len(message)
        if done:
            break
        steps += 1
        if kind == "sleep":
            time.sleep(step_s)
        else:
            deadline = time.monotonic() + step_s
            while time.monotonic() < deadline:
                pass
    out.send({"lags": lags, "last_lag": last_lag, "last_at": last_at, "batch_max": batch_max,
              "steps": steps, "bytes": nbytes})
    channel.close()


async def _send(address_dir: str, kind: str, step_s: float,
                args: argparse.Namespace) -> dict[str, Any]:
    from omni.runtime.control import ControlRouter

    loop = asyncio.get_running_loop()
    ready: asyncio.Future[bytes] = loop.create_future()

    def on_message(peer: bytes, message: bytes) -> None:
        if isinstance(decode(message), Ready) and not ready.done():
            ready.set_result(peer)

    router = ControlRouter(ipc_address(address_dir), on_message)
    router.attach(loop)
    results, out = multiprocessing.get_context("spawn").Pipe(duplex=False)
    child = multiprocessing.get_context("spawn").Process(
        target=_receiver, args=(router.address, kind, step_s, out), daemon=True)
    child.start()
    try:
        peer = await asyncio.wait_for(ready, READY_TIMEOUT_S)
        data = {"bytes": b"\0" * args.row_bytes}
        sent, seq, first_sent, round_max, size, t0 = 0, 0, None, 0.0, 0, 0.0
        started = time.monotonic()
        while True:
            last = time.monotonic() - started >= args.seconds
            t0 = time.monotonic()
            for i in range(args.rows):
                message = encode(Append(f"req-{i}", "thinker", seq, data, last,
                                        time.monotonic()))
                router.send(peer, message)
                size = len(message)
            round_max = max(round_max, time.monotonic() - t0)
            first_sent = first_sent or t0
            sent += args.rows
            seq += 1
            if last:
                break
            # on a fixed schedule, so the rate offered is the rate sent
            await asyncio.sleep(max(0.0, first_sent + seq * args.producer_step_ms / 1e3
                                    - time.monotonic()))
        router.send(peer, encode(Shutdown()))
        got = await loop.run_in_executor(None, _wait_result, results, child)
        child.join(10)
    finally:
        if child.is_alive():
            child.terminate()
            child.join()
        router.close()
    if len(got["lags"]) != sent:
        raise RuntimeError(f"{kind} {step_s}: {len(got['lags'])} of {sent} messages arrived")
    got.update(sent=sent, message_bytes=size, round_max_s=round_max,
               span_s=got["last_at"] - first_sent, send_span_s=t0 - first_sent,
               sent_bytes=(sent - args.rows) * size)  # the rounds before the last one's start
    return got


def _wait_result(results: Any, child: multiprocessing.process.BaseProcess) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while not results.poll(0.5):
        if not child.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the receiver sent no result (exit code {child.exitcode})")
    return results.recv()


def measure(kind: str, step_ms: float, args: argparse.Namespace) -> dict[str, Any]:
    import uvloop

    tmp = tempfile.mkdtemp(prefix="bench-lag-")
    try:
        got = uvloop.run(_send(tmp, kind, step_ms / 1e3, args))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lags = sorted(got["lags"])
    per_s = args.rows / (args.producer_step_ms / 1e3)
    last_ms = got["last_lag"] * 1e3
    result = {"step": kind, "consumer_step_ms": step_ms, "messages": got["sent"],
              "message_bytes": got["message_bytes"], "steps": got["steps"],
              "offered_mb_s": round(per_s * got["message_bytes"] / 1e6, 2),
              "sent_mb_s": round(got["sent_bytes"] / got["send_span_s"] / 1e6, 2),
              "delivered_mb_s": round(got["bytes"] / got["span_s"] / 1e6, 2),
              "lag_p50_ms": round(percentile(lags, 0.5) * 1e3, 2),
              "lag_p99_ms": round(percentile(lags, 0.99) * 1e3, 2),
              "lag_max_ms": round(lags[-1] * 1e3, 2),
              "lag_mean_ms": round(statistics.fmean(lags) * 1e3, 2),
              "last_input_lag_ms": round(last_ms, 2),
              "last_within_one_step": last_ms <= step_ms,
              "max_within_one_step": lags[-1] * 1e3 <= step_ms,
              "batch_max": got["batch_max"],
              "send_round_max_ms": round(got["round_max_s"] * 1e3, 3),
              "seconds": round(got["span_s"], 2)}
    say(f"[channel_lag] {kind} {step_ms} ms: " + ", ".join(
        f"{k} {v}" for k, v in result.items() if k not in ("step", "consumer_step_ms")))
    return result


def render(data: dict[str, Any]) -> str:
    m, a = data["machine"], data["settings"]
    lines = ["# Stream inputs into a busy engine over ZeroMQ: lag from send to receipt", "",
             f"Date: {data['date']}  ",
             f"Command: `{data['command']}`  ",
             f"Machine: {m['cpu_model']}, {m['cores']} cores; Python {m['python']}, pyzmq "
             f"{m['pyzmq']} / libzmq {m['libzmq']}, uvloop {m['uvloop']}; load average at "
             f"start {m['loadavg_at_start']}, at end {data['loadavg_at_end']}  ",
             f"Settings: {a['rows']} APPEND messages of {a['row_bytes']} data bytes every "
             f"{a['producer_step_ms']} ms for {a['seconds']} s; receiver steps "
             f"{a['consumer_step_ms']} ms, {a['step_kinds']}", "",
             "| step | step (ms) | messages | bytes each | offered (MB/s) | sent (MB/s) | "
             "delivered (MB/s) | "
             "lag p50 (ms) | lag p99 (ms) | lag max (ms) | lag mean (ms) | **last input "
             "lag (ms)** | last <= one step? | most per receive | send round max (ms) | "
             "run (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in data["rows"]:
        ok = "yes" if r["last_within_one_step"] else "**no**"
        lines.append(
            f"| {r['step']} | {r['consumer_step_ms']:g} | {r['messages']} | "
            f"{r['message_bytes']} | {r['offered_mb_s']} | {r['sent_mb_s']} | "
            f"{r['delivered_mb_s']} | "
            f"{r['lag_p50_ms']} | {r['lag_p99_ms']} | {r['lag_max_ms']} | {r['lag_mean_ms']} | "
            f"**{r['last_input_lag_ms']}** | {ok} | {r['batch_max']} | "
            f"{r['send_round_max_ms']} | {r['seconds']} |")
    return "\n".join(lines + ["", *_reading(data), "", "Method: " + METHOD]) + "\n"


def _reading(data: dict[str, Any]) -> list[str]:
    rows = data["rows"]
    worst = max(rows, key=lambda r: r["last_input_lag_ms"] / r["consumer_step_ms"])
    kept = [r for r in rows if r["delivered_mb_s"] >= 0.97 * r["sent_mb_s"]]
    text = (f"Reading: the last input's lag stayed within one consumer step in "
            f"{sum(r['last_within_one_step'] for r in rows)} of {len(rows)} rows (the "
            f"closest: {worst['step']} {worst['consumer_step_ms']:g} ms, "
            f"{worst['last_input_lag_ms']} ms = "
            f"{worst['last_input_lag_ms'] / worst['consumer_step_ms']:.2f} steps); the "
            f"receiver's rate was within 3% of the sender's in {len(kept)} of {len(rows)} "
            "rows, so inputs do not queue up behind the steps. (The last input's lag is one "
            "sample: where in a step it lands is chance; the p99 and max say the same of all.)")
    over = [r for r in rows if not r["max_within_one_step"]]
    if over:
        text += (" The largest lag of any message passed one step by " + ", ".join(
            f"{r['lag_max_ms'] - r['consumer_step_ms']:.1f} ms ({r['step']} "
            f"{r['consumer_step_ms']:g} ms)" for r in over)
            + ": a message that lands just after a receive waits the whole step, plus a "
            "sleep that wakes late or a process that waits for a core on a busy host.")
    else:
        text += " No message waited longer than one step."
    return [text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.channel_lag", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=METHOD)
    parser.add_argument("--rows", type=int, default=32,
                        help="messages per producer step (requests; default 32)")
    parser.add_argument("--row-bytes", type=int, default=8200,
                        help="data bytes per message (default 8200: an 8 KiB row + ids)")
    parser.add_argument("--producer-step-ms", type=float, default=14.6,
                        help="the sender's period (default 14.6, the thinker's step)")
    parser.add_argument("--consumer-step-ms", default="44,20",
                        help="the receiver's steps, comma separated (default 44,20: the "
                             "talker's step and a shorter one)")
    parser.add_argument("--step-kinds", default="sleep,spin",
                        help="sleep (the GIL free, like a GPU step), spin (busy in Python, "
                             "like a CPU step); default both")
    parser.add_argument("--seconds", type=float, default=8.0, help="how long the sender sends")
    parser.add_argument("--tag", default="", help="report name suffix")
    parser.add_argument("--out", default="bench/results", help="directory for the report")
    args = parser.parse_args(argv)
    kinds = args.step_kinds.split(",")
    if not set(kinds) <= {"sleep", "spin"}:
        parser.error(f"--step-kinds takes sleep, spin; got {args.step_kinds!r}")
    try:
        steps = [float(v) for v in args.consumer_step_ms.split(",")]
    except ValueError:
        parser.error(f"--consumer-step-ms takes numbers, got {args.consumer_step_ms!r}")
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    machine = hardware()
    rows = [measure(kind, step, args) for kind in kinds for step in steps]
    argv_used = argv if argv is not None else sys.argv[1:]
    settings = {k: getattr(args, k) for k in ("rows", "row_bytes", "producer_step_ms",
                                             "consumer_step_ms", "step_kinds", "seconds")}
    data = {"command": " ".join(["python -m bench.channel_lag", *argv_used]), "date": started,
            "machine": machine, "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
            "settings": settings, "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "channel-lag" + (f"-{args.tag}" if args.tag else "")
    (out / f"{name}.md").write_text(render(data))
    (out / f"{name}.json").write_text(json.dumps(data, indent=1))
    say(f"[channel_lag] wrote {out / f'{name}.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
