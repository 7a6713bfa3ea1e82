"""Host work per graphed decode step: block tables vs slots expanded on the host.

``python -m bench.decode_fill [--device cuda] [--out bench/results]``
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

from bench.common import hardware, say
from omni.engines.ar.decode_graphs import DecodeGraphs
from omni.engines.ar.kv_cache import PagedKVCache
from omni.engines.ar.paged_attention import padded_context_slots

METHOD = """Before each CUDA-graph replay the engine fills the graph's static inputs. Two ways, in one
run on the same batches:

- `host slots` (the baseline, what decode_graphs did before): expand every sequence's
  block table into a (batch, context) slot tensor and validity mask on the host
  (paged_attention.padded_context_slots) and copy both to the device;
- `block tables` (ours, DecodeGraphs._fill): send (batch, blocks) block ids and the
  lengths; the graph expands them on the device (paged_attention.table_slots).

The time is the host's: the GPU waits for it every step, so it adds to the step time.
Not in it: the expansion on the device (one gather and one compare per step, inside the
captured graph), which runs on the GPU. Both ways give the graph the same slots (checked).
"""

SHAPES = ((8, 256), (32, 256), (8, 4096), (32, 4096), (64, 8192))
BLOCK = 16


def _graphs(batch: int, width: int, device: torch.device) -> DecodeGraphs:
    """DecodeGraphs' static buffers and fill, without a model or a capture."""
    cache = PagedKVCache(1, 1, 8, batch * width // BLOCK + 2, BLOCK, torch.float32, device)
    return DecodeGraphs(None, cache, batch, width, device)


def _host_slots(graphs: DecodeGraphs, slots_buf: torch.Tensor, valid_buf: torch.Tensor,
                tokens: list[int], positions: list[int], tables: list[list[int]]) -> None:
    """The baseline: the pre-change fill (slots and mask built on the host, then copied)."""
    b, width = slots_buf.shape
    slots, valid = padded_context_slots(tables, [p + 1 for p in positions], BLOCK, width,
                                        pad_block=graphs.scratch // BLOCK)
    pos = torch.tensor(positions, dtype=torch.long)
    graphs.ids[0, :b].copy_(torch.tensor(tokens), non_blocking=True)
    graphs.positions[0, :b].copy_(pos, non_blocking=True)
    graphs.write[:b].copy_(slots[torch.arange(b), pos], non_blocking=True)
    slots_buf.copy_(slots, non_blocking=True)
    valid_buf.copy_(valid, non_blocking=True)
    graphs.lens[:b].copy_(pos + 1, non_blocking=True)


def _time(fn: Any, device: torch.device, rounds: int) -> float:
    for _ in range(3):
        fn()
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return sorted(samples)[len(samples) // 2] * 1e3


def measure(device: torch.device, rounds: int) -> list[dict[str, Any]]:
    rows = []
    for batch, width in SHAPES:
        graphs = _graphs(batch, width, device)
        blocks = width // BLOCK
        tables = [list(range(1 + i * blocks, 1 + (i + 1) * blocks)) for i in range(batch)]
        positions = [width - 1 - (i % BLOCK) for i in range(batch)]
        tokens = list(range(batch))
        slots = torch.zeros(batch, width, dtype=torch.long, device=device)
        valid = torch.zeros(batch, width, dtype=torch.bool, device=device)
        host = _time(partial(_host_slots, graphs, slots, valid, tokens, positions, tables),
                     device, rounds)
        ours = _time(partial(graphs._fill, tokens, positions, tables, batch, width),
                     device, rounds)
        layout = graphs._layout(batch, width)  # same inputs for the graph either way
        assert torch.equal(layout.padded_slots, slots) and torch.equal(layout.padded_valid, valid)
        rows.append({"batch": batch, "context": width, "host_slots_ms": round(host, 3),
                     "block_tables_ms": round(ours, 3),
                     "host_slots_bytes": batch * width * 9, "block_tables_bytes": batch * blocks * 8})
        say(f"[decode_fill] batch {batch}, context {width}: host slots {host:.3f} ms, "
            f"block tables {ours:.3f} ms")
    return rows


def render(rows: list[dict[str, Any]], command: str, machine: dict[str, Any],
           device: torch.device) -> str:
    lines = ["# Host work per graphed decode step: block tables vs host-expanded slots", "",
             f"Command: `{command}`  ",
             f"Machine: {machine['cpu_model']}, {machine['cores']} cores; device {device}; "
             f"torch {torch.__version__}", "",
             "| batch | context | host slots (ms) | block tables (ms) | bytes sent, host slots | "
             "bytes sent, block tables |", "|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['batch']} | {r['context']} | {r['host_slots_ms']} | {r['block_tables_ms']}"
              f" | {r['host_slots_bytes']:,} | {r['block_tables_bytes']:,} |" for r in rows]
    lines += ["", "Method: median over the rounds of one fill, one thread. " + METHOD]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.decode_fill", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=METHOD)
    parser.add_argument("--device", default="cpu", help="where the static buffers live "
                        "(cpu, or cuda to include the host-to-device copies; default cpu)")
    parser.add_argument("--rounds", type=int, default=200, help="fills timed per shape")
    parser.add_argument("--out", default="bench/results", help="directory for the report")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    device = torch.device(args.device)
    rows = measure(device, args.rounds)
    command = "python -m bench.decode_fill " + " ".join(argv if argv is not None else sys.argv[1:])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "" if device.type == "cpu" else f"-{device.type}"
    machine = hardware()
    (out / f"decode-fill{tag}.md").write_text(render(rows, command.strip(), machine, device))
    (out / f"decode-fill{tag}.json").write_text(json.dumps(
        {"command": command.strip(), "machine": machine, "rows": rows}, indent=1))
    say(f"[decode_fill] wrote {out / f'decode-fill{tag}.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
