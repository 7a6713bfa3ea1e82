"""A stage in its own Python environment vs the same stage in the server's: time to READY,
time to READY again after a SIGKILL (restart: true), and the engine process's memory
(RSS, PSS, USS from /proc/PID/smaps_rollup) once it has answered one request.

    OMP_NUM_THREADS=1 python bench/probes/stage_env.py [--rounds 3] [--vllm-python PY]
        [--assistant]

The stage is the default's llm: SmolLM2-135M-Instruct on the ar engine (CPU), greedy, 16
tokens; alone, or with --assistant inside the whole default assistant (Whisper, Piper and
Silero VAD forked beside it: READY is then the whole pipeline's). Every round starts a
fresh server process (its fork server starts with it, as in a real server start).
Variants:
- `forked`: no `python:`, forked from the server's fork server (torch and transformers
  imported there once, pages shared copy-on-write);
- `python: server's`: `python:` naming the server's own interpreter: the mechanism alone
  (a fresh interpreter that imports torch and transformers itself);
- `python: .venv-vllm`: another environment (vllm's pins: transformers 5.19).
Prints one JSON line per start and a table of medians (bench/results/stage-env.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _memory_mib(pid: int) -> dict[str, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Rss", "Pss", "Private_Clean", "Private_Dirty"):
            fields[key] = int(value.split()[0]) / 1024
    return {"rss": fields["Rss"], "pss": fields["Pss"],
            "uss": fields["Private_Clean"] + fields["Private_Dirty"]}


async def _answer(omni) -> str:  # noqa: ANN001 - an AsyncOmni
    outputs = [o async for o in omni.generate(
        {"prompt": "The capital of France is"}, input_modalities=["text"],
        params={"llm": {"temperature": 0, "max_tokens": 16}})]
    return "".join(o.data.get("text", "") for o in outputs if o.data)


def _pipeline(python: str | None, assistant: bool):  # noqa: ANN202 - a PipelineConfig
    import yaml

    from omni.config.pipeline import parse_pipeline
    from omni.config.presets import preset_path
    from omni.models.smollm2 import ensure_smollm2

    own = {"model_dir": str(ensure_smollm2()), "restart": True,
           **({"python": python} if python else {})}
    if not assistant:
        return parse_pipeline({"name": "p", "stages": [
            {"name": "llm", "engine": "ar", "final_output": "text", **own}]})
    data = yaml.safe_load(preset_path("assistant").read_text())
    next(s for s in data["stages"] if s["name"] == "llm").update(own)
    return parse_pipeline(data)


async def one(python: str | None, assistant: bool = False) -> dict:
    """One server start with the stage, then one restart; in this process."""
    from omni import AsyncOmni

    pipeline = _pipeline(python, assistant)
    began = time.monotonic()
    omni = await AsyncOmni(pipeline).start()
    result = {"python": python or "forked", "ready_s": time.monotonic() - began}
    try:
        replica = omni.orchestrator.engines.replicas["llm/0"]
        result["answer"] = await _answer(omni)
        result.update(_memory_mib(replica.process.pid))
        result["versions"] = replica.info.get("versions")
        killed = time.monotonic()
        os.kill(replica.process.pid, signal.SIGKILL)
        while not (replica.restarts == 1 and replica.alive):
            await asyncio.sleep(0.01)
        result["restart_s"] = time.monotonic() - killed
    finally:
        await omni.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--assistant", action="store_true",
                        help="the llm inside the whole default assistant")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: one variant, one round
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(asyncio.run(one(args.one or None, args.assistant))), flush=True)
        return
    variants = {"forked": "", "python: server's": sys.executable,
                "python: .venv-vllm": args.vllm_python}
    rows = {}
    for label, python in variants.items():
        runs = []
        for _ in range(args.rounds):
            out = subprocess.run([sys.executable, __file__, "--one", python,
                                  *(["--assistant"] if args.assistant else [])], check=True,
                                 capture_output=True, text=True).stdout.strip().splitlines()
            runs.append(json.loads(out[-1]))
            print(label, out[-1], flush=True)
        rows[label] = runs
    print("\n| variant | READY s | restart s | RSS MiB | PSS MiB | USS MiB | versions |")
    print("|---|---|---|---|---|---|---|")
    for label, runs in rows.items():
        med = {k: statistics.median(r[k] for r in runs)
               for k in ("ready_s", "restart_s", "rss", "pss", "uss")}
        versions = runs[0]["versions"]
        print(f"| {label} | {med['ready_s']:.2f} | {med['restart_s']:.2f} | {med['rss']:.0f} "
              f"| {med['pss']:.0f} | {med['uss']:.0f} | python {versions['python']}, torch "
              f"{versions['torch']}, transformers {versions['transformers']} |")
    answers = {r["answer"] for runs in rows.values() for r in runs}
    print(f"\ngreedy answers: {len(answers)} distinct: {sorted(answers)}")


if __name__ == "__main__":
    main()
