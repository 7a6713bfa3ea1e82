"""How long a stream of small messages waits to reach an engine that is busy stepping.

``python -m bench.channel_lag [--rows 32] [--row-bytes 8200] [--producer-step-ms 14.6]
[--consumer-step-ms 44] [--seconds 8]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import statistics
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import hardware, percentile, say
from omni.engines.channel import Channel
from omni.protocol import frame

METHOD = """One socket pair, as between the orchestrator and an engine process. The sender is
an asyncio event loop in a thread (uvloop when installed, as in the server) writing with
transport.write, as omni/runtime/launcher.py does: every producer step (the upstream stage's
step) it writes `rows` messages of `row_bytes` bytes (one hidden-state row per request
for the talker), each stamped with its send time. The receiver is the engine's Channel
(omni/engines/channel.py) in the engine loop's pattern: read what is there, then a
"step" (a sleep of the consumer's step time, like a GPU step that waits on the device),
again and again. Lag = the time from a message's write to its return by receive().
Sides, the same Channel class:

- `between-steps`: the receiver reads only between steps (the engine before this
  change);
- `drainer`: each step is bracketed by Channel.step_begins() and step_ends(), as the
  engine loop does, so the drainer thread reads what arrives during it.

The defaults are the H200 rates of bench/results/omni-h200-c32-stream.md: 32 requests, a
thinker step of 14.6 ms, a talker step of 44 ms, 8 KiB rows (2 hidden layers x 2048 x
bf16) plus the message's framing. `offered` is the bytes per second the sender writes;
`delivered` what the receiver got per second over the run."""


class _BetweenStepsOnly(Channel):
    """The receiver of before: nobody reads while a step runs."""

    def step_begins(self) -> None:
        pass

    def step_ends(self) -> None:
        pass


async def _send(sock: socket.socket, args: argparse.Namespace, box: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, sock)
    pad = b"\0" * (args.row_bytes - 8)
    sent, started = 0, time.monotonic()
    while time.monotonic() - started < args.seconds:
        for _ in range(args.rows):
            transport.write(frame(struct.pack("<d", time.monotonic()) + pad))
            sent += 1
        await asyncio.sleep(args.producer_step_ms / 1e3)
    box["sent"] = sent
    while not box["finished"].is_set():  # keep the connection until the receiver has all
        await asyncio.sleep(0.01)
    transport.close()


def _sender_thread(sock: socket.socket, args: argparse.Namespace,
                   box: dict[str, Any]) -> threading.Thread:
    def run() -> None:
        with contextlib.suppress(ImportError):
            import uvloop
            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        asyncio.run(_send(sock, args, box))
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def measure(side: str, args: argparse.Namespace) -> dict[str, Any]:
    engine_end, orchestrator_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    channel = (_BetweenStepsOnly if side == "between-steps" else Channel)(engine_end)
    box: dict[str, Any] = {"finished": threading.Event()}
    lags: list[float] = []
    started = time.monotonic()
    sender = _sender_thread(orchestrator_end, args, box)
    try:
        while len(lags) < box.get("sent", float("inf")):
            for message in channel.receive(block=False):
                lags.append(time.monotonic() - struct.unpack_from("<d", message)[0])
            if time.monotonic() - started > 30 * args.seconds:
                raise RuntimeError(f"{side}: {len(lags)} of {box.get('sent')} messages arrived")
            channel.step_begins()
            time.sleep(args.consumer_step_ms / 1e3)
            channel.step_ends()
    finally:
        elapsed = time.monotonic() - started
        box["finished"].set()
        sender.join(timeout=10)
        channel.close()
        engine_end.close()
    lags.sort()
    message_bytes = args.row_bytes + 4
    result = {"side": side, "messages": len(lags), "seconds": round(elapsed, 2),
              "offered_mb_s": round(args.rows * message_bytes / (args.producer_step_ms / 1e3)
                                    / 1e6, 2),
              "delivered_mb_s": round(len(lags) * message_bytes / elapsed / 1e6, 2),
              "lag_p50_ms": round(percentile(lags, 0.5) * 1e3, 2),
              "lag_p99_ms": round(percentile(lags, 0.99) * 1e3, 2),
              "lag_max_ms": round(lags[-1] * 1e3, 2),
              "lag_mean_ms": round(statistics.fmean(lags) * 1e3, 2)}
    say(f"[channel_lag] {side}: " + ", ".join(f"{k} {v}" for k, v in result.items()
                                               if k != "side"))
    return result


def render(data: dict[str, Any]) -> str:
    m, a = data["machine"], data["settings"]
    lines = ["# Messages into a busy engine: read between steps only vs a drainer thread", "",
             f"Command: `{data['command']}`  ",
             f"Machine: {m['cpu_model']}, {m['cores']} cores; Python {m['python']}  ",
             f"Settings: {a['rows']} messages of {a['row_bytes']} bytes every "
             f"{a['producer_step_ms']} ms for {a['seconds']} s; receiver step "
             f"{a['consumer_step_ms']} ms", "",
             "| side | messages | offered (MB/s) | delivered (MB/s) | lag p50 (ms) | "
             "lag p99 (ms) | lag max (ms) | lag mean (ms) | run (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in data["rows"]:
        lines.append(f"| {r['side']} | {r['messages']} | {r['offered_mb_s']} | "
                     f"{r['delivered_mb_s']} | {r['lag_p50_ms']} | {r['lag_p99_ms']} | "
                     f"{r['lag_max_ms']} | {r['lag_mean_ms']} | {r['seconds']} |")
    return "\n".join(lines + ["", "Method: " + METHOD]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.channel_lag", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=METHOD)
    parser.add_argument("--rows", type=int, default=32,
                        help="messages per producer step (requests; default 32)")
    parser.add_argument("--row-bytes", type=int, default=8200,
                        help="bytes per message body (default 8200: an 8 KiB row + ids)")
    parser.add_argument("--producer-step-ms", type=float, default=14.6,
                        help="the sender's period (default 14.6, the thinker's step)")
    parser.add_argument("--consumer-step-ms", type=float, default=44.0,
                        help="the receiver's step (default 44, the talker's step)")
    parser.add_argument("--seconds", type=float, default=8.0, help="how long the sender sends")
    parser.add_argument("--sides", default="between-steps,drainer",
                        help="between-steps, drainer (default both)")
    parser.add_argument("--tag", default="", help="report name suffix")
    parser.add_argument("--out", default="bench/results", help="directory for the report")
    args = parser.parse_args(argv)
    if args.row_bytes < 8:
        parser.error("--row-bytes must be at least 8 (the send time)")
    sides = args.sides.split(",")
    if not set(sides) <= {"between-steps", "drainer"}:
        parser.error(f"--sides takes between-steps, drainer; got {args.sides!r}")
    rows = [measure(side, args) for side in sides]
    argv_used = argv if argv is not None else sys.argv[1:]
    settings = {k: getattr(args, k) for k in ("rows", "row_bytes", "producer_step_ms",
                                             "consumer_step_ms", "seconds")}
    data = {"command": "python -m bench.channel_lag " + " ".join(argv_used),
            "machine": hardware(), "settings": settings, "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "channel-lag" + (f"-{args.tag}" if args.tag else "")
    (out / f"{name}.md").write_text(render(data))
    (out / f"{name}.json").write_text(json.dumps(data, indent=1))
    say(f"[channel_lag] wrote {out / f'{name}.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
