"""Model load time and peak host memory: omni's loader (from_pretrained on the host, then
``.to(cuda)``) vs transformers loading straight onto the GPU (``device_map``), one fresh
process per side and repeat, alternating.

    python -m bench.load_time --model DIR [--repeats 2] [--out bench/results/load.md]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

SIDES = ("omni-host-then-copy", "device-map")


def _child(model_dir: str, side: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from omni.models.hf_causal import load_causal_lm

    start = time.perf_counter()
    if side == "omni-host-then-copy":
        model = load_causal_lm(model_dir, dtype="auto", device="cuda").model
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16,
                                                     local_files_only=True,
                                                     device_map="cuda")
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    assert next(model.parameters()).device.type == "cuda"
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024
    print(json.dumps({"side": side, "load_s": round(seconds, 2),
                      "peak_host_rss_gib": round(peak_gib, 2)}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a local causal-LM directory")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench/results/load.md"))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.model, args.child)
        return 0
    rows = []
    for _ in range(args.repeats):
        for side in SIDES:
            out = subprocess.run([sys.executable, "-m", "bench.load_time", "--model",
                                  args.model, "--child", side], capture_output=True,
                                 text=True, check=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
            print(rows[-1], file=sys.stderr, flush=True)
    import torch

    lines = [f"# Model load: {Path(args.model).name}", "",
             f"Command: `python -m bench.load_time --model {args.model} --repeats "
             f"{args.repeats}`  ", f"Device: {torch.cuda.get_device_name()} (torch "
             f"{torch.__version__})", "", "| side | load s | peak host RSS GiB |",
             "|---|---|---|"]
    lines += [f"| {r['side']} | {r['load_s']} | {r['peak_host_rss_gib']} |" for r in rows]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
