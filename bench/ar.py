"""Autoregressive serving: our server and engine vs transformers generate, in one run.

DESCRIPTION is the --help text; the report (ar.md) repeats the method.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path
from typing import Any

from bench.ar_ours import cuda_available, measure, target_for
from bench.ar_report import brief, summarize
from bench.common import hardware, say

DESCRIPTION = """\
Tokens/s, time to first token (TTFT) and inter-token latency (ITL) of one causal LM at
several concurrencies, for these sides, on the same model and prompts in one run:

  ours-http      `python -m omni.server --model DIR --port 0 --dtype DTYPE` started as a
                 subprocess; c concurrent streaming clients (aiohttp) POST /v1/completions
                 with "prompt": [token ids], max_tokens N, ignore_eos, temperature 0,
                 stream, stream_options.include_usage, and parse the SSE stream
  ours-inproc    the same requests through omni.AsyncOmni(load_pipeline(DIR)) in this
                 process (the same pipeline and engine as the server's, without HTTP):
                 "the engine called in-process", the reference for the HTTP TTFT check
  hf-sequential  transformers AutoModelForCausalLM.generate (greedy, min_new_tokens =
                 max_new_tokens = N) called for one request after another
  hf-batched     one generate() call over all c prompts of a burst (equal lengths, so no
                 padding is needed)
  vllm-inproc    (not run by default) as ours-inproc, with the preset's stages on
                 `engine: vllm` (where vllm is installed: scripts/install_vllm_env.sh)

Prompts are deterministic random token ids (seeded, different for every request, drawn
below the tokenizer's special ids), --prompt-len long; every request gets exactly
--new-tokens new tokens (ignore_eos / min_new_tokens). At concurrency c, c requests start
together (a burst); TTFT counts from the burst's start, so queueing is included (the
sequential baseline serves a burst one request after another). HTTP TTFT is the arrival
of the first SSE chunk carrying a choice (as vLLM's benchmark counts it; the server sends
it when the engine's first token arrives); in-process TTFT is the first output carrying
token ids. ITL of a request = (time of its last token - time of its first) / (tokens - 1)
(p50 over requests; other requests' prefills that run meanwhile count in it). Step p50 =
the median gap between consecutive tokens of a request, over all requests (HTTP: gaps
between chunks that carry text): the decode step time at that concurrency, compared with
the roofline. Throughput = output tokens / wall time of the bursts. Before each
concurrency every side warms up, unmeasured, on other prompts (so measured prompts never
hit a prefix cache): ours with one full burst (lazily captured CUDA graphs of every
batch and context shape the burst needs then exist), hf-batched with one 8-token batch
of c, hf-sequential with one 8-token request. The server preset admits 64 requests at
once; higher concurrencies get 429s.

Sides run one after another (one model in memory at a time): ours-http, ours-inproc, then
the copy-bandwidth probe, then the transformers sides (one model load for both). CUDA is
first touched in this process after our engines stopped. A slow side can run in a second
command with --merge (same model, lengths, device, dtype and seed; concurrencies may
differ): its rows join the earlier JSON and report.

Roofline of one decode step at batch B = bytes it must read / measured copy bandwidth:
every layer's weights (attention, dense MLP, router), for MoE layers only the experts the
step routes to (expected distinct experts per layer at batch B: E * (1 - (1 - k/E)^B),
uniform routing), lm_head, plus the KV cache read at the mean context of the decode steps
(prompt + new/2). Bandwidth = a large device-to-device tensor copy, (bytes read + bytes
written) / time, measured in the same run. The report gives each side's decode step time
and tokens/s against it at batch 1 and at each concurrency.

With no --model, the tiny random-weight Qwen3 fixture is used (built on first use); for
real-size random-weight checkpoints see scripts/build_random_model.py. Output text of
random weights is meaningless: use them for speed only.
"""

WARMUP_TOKENS = 8  # the transformers sides' warm-up generations
SIDES = ("ours-http", "ours-inproc", "hf-sequential", "hf-batched")
# not run by default: vllm (where installed) serving the same preset with `engine: vllm`,
# in-process through AsyncOmni like ours-inproc
VLLM_SIDE = "vllm-inproc"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, metavar="DIR",
                        help="a local HF causal-LM directory (default: the tiny random Qwen3 "
                             "fixture from omni.fixtures, built on first use)")
    parser.add_argument("--sides", default=",".join(SIDES),
                        help=f"which sides to run (default {','.join(SIDES)})")
    parser.add_argument("--concurrency", default="1,8,32",
                        help="comma-separated concurrencies (default 1,8,32)")
    parser.add_argument("--bursts", default=None,
                        help="measured bursts per concurrency, in the same order, or one value "
                             "for all (default: 3 below c=4, 2 below c=8, else 1)")
    parser.add_argument("--prompt-len", type=int, default=128,
                        help="prompt tokens per request (default 128)")
    parser.add_argument("--new-tokens", type=int, default=128,
                        help="new tokens per request, exactly (default 128)")
    parser.add_argument("--device", default=None,
                        help="cuda, cuda:N or cpu (default: cuda when available, else cpu); "
                             "ours: the stage's device, the transformers sides: the model's")
    parser.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                        help="weights dtype everywhere (default: bfloat16 on cuda, float32 on "
                             "cpu)")
    parser.add_argument("--seed", type=int, default=0, help="prompt seed (default 0)")
    parser.add_argument("--server-timeout", type=float, default=1200.0,
                        help="seconds to wait for the server to listen (default 1200)")
    parser.add_argument("--tag", default=None,
                        help="results go to ar-TAG.md / ar-TAG.json (default ar.md / ar.json)")
    parser.add_argument("--merge", action="store_true",
                        help="add this run's sides to the existing ar[-TAG].json in --out (same "
                             "model, lengths, device, dtype, seed; e.g. a slow side run in a "
                             "second command, or at fewer concurrencies)")
    parser.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an option for our engine's stages (repeatable; the value is "
                             "read as YAML), e.g. attention_kernel=sdpa or cuda_graphs=false: "
                             "our sides then load a copy of the preset with it")
    parser.add_argument("--out", default="bench/results",
                        help="directory for the report and the JSON (default bench/results)")


# -- prompts ------------------------------------------------------------------------------
class Prompts:
    """Seeded random token ids between the tokenizer's special ids, one list per request:
    specials in the upper half of the vocabulary (Qwen's) bound it from above, those in
    the lower half (SmolLM2's, ids 0-16) from below."""

    def __init__(self, model_dir: str, length: int, seed: int) -> None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        half = len(tok) // 2
        self.low = max([-1, *(i for i in tok.all_special_ids if i < half)]) + 1
        self.limit = min([len(tok), *(i for i in tok.all_special_ids if i >= half)])
        self.length, self.seed = length, seed

    def burst(self, tag: str, count: int) -> list[list[int]]:
        out = []
        for i in range(count):
            rng = random.Random(f"{self.seed}:{tag}:{i}")
            out.append([rng.randrange(self.low, self.limit) for _ in range(self.length)])
        return out


# -- the transformers sides -----------------------------------------------------------------
def _hf(sides: list[str], model_dir: str, device: str, dtype: str,
        plan: list[tuple[int, int]], prompts: Prompts,
        new_tokens: int) -> tuple[dict[str, Any], dict[str, Any]]:
    from bench.ar_hf import BURSTS, HFRunner

    hf, out = HFRunner(model_dir, device, dtype), {}
    try:
        for side in sides:
            out[side] = {}
            for c, bursts in plan:
                warm = prompts.burst(f"warm-c{c}", 1 if side == "hf-sequential" else c)
                BURSTS[side](hf, warm, min(WARMUP_TOKENS, new_tokens))
                runs, wall = [], 0.0
                for b in range(bursts):
                    got, took = BURSTS[side](hf, prompts.burst(f"c{c}-b{b}", c), new_tokens)
                    runs, wall = runs + got, wall + took
                out[side][str(c)] = summarize(runs, wall, new_tokens)
                say(f"[ar] {side} c={c}: {brief(out[side][str(c)])}")
    finally:
        hf.close()
    return out, hf.implementation


# -- run ----------------------------------------------------------------------------------
def _plan(args: argparse.Namespace) -> list[tuple[int, int]]:
    levels = [int(x) for x in args.concurrency.split(",") if x]
    bursts = [int(x) for x in args.bursts.split(",") if x] if args.bursts else \
        [min(3, max(1, 8 // c)) for c in levels]
    if len(bursts) == 1:
        bursts *= len(levels)
    if len(bursts) != len(levels) or min(levels + bursts) < 1:
        raise SystemExit("--bursts needs one positive value per --concurrency value (or one)")
    return list(zip(levels, bursts, strict=True))


def _merge_base(path: Path, result: dict[str, Any]) -> dict[str, Any]:
    """The earlier run's JSON that --merge adds to; refuses other settings or model."""
    if not path.is_file():
        raise SystemExit(f"--merge: no {path} to merge into")
    old = json.loads(path.read_text())
    keys = ("prompt_len", "new_tokens", "device", "dtype", "seed")  # the plan may differ
    mine = {k: result["settings"][k] for k in keys} | {"model_dir": result["model_dir"]}
    theirs = {k: old["settings"][k] for k in keys} | {"model_dir": old["model_dir"]}
    if json.loads(json.dumps(mine)) != theirs:
        raise SystemExit(f"--merge: {path} was run with other settings: {theirs}")
    return old


def _merged(old: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    results = {**old["results"], **result["results"]}  # this run's sides replace the same
    result["results"] = {s: results[s] for s in (*SIDES, VLLM_SIDE) if s in results}
    result["settings"]["sides"] = list(result["results"])
    plan = dict(map(tuple, old["settings"]["plan"])) | dict(result["settings"]["plan"])
    result["settings"]["plan"] = sorted(plan.items())
    result["command"] = f"{old['command']}; then {result['command']}"
    result["bandwidth_earlier"] = old["bandwidth"]
    for key in ("transformers_implementation", "engine_info"):
        result.setdefault(key, old.get(key))
    return result


def _engine_options(pairs: list[str]) -> dict[str, Any]:
    import yaml

    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--engine-option wants KEY=VALUE, got {pair!r}")
        options[key] = yaml.safe_load(value)
    return options


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from omni.fixtures.tiny_models import ensure_tiny_model

    sides = [s for s in args.sides.split(",") if s]
    known = (*SIDES, VLLM_SIDE)
    if unknown := set(sides) - set(known):
        raise SystemExit(f"unknown sides {sorted(unknown)}; known: {', '.join(known)}")
    sides = [s for s in known if s in sides]
    plan = _plan(args)
    Path(args.out).mkdir(parents=True, exist_ok=True)  # the server's log goes there too
    engine_options = _engine_options(args.engine_option)
    out = Path(args.out)
    stem = f"ar-{args.tag}" if args.tag else "ar"
    device = args.device or ("cuda" if cuda_available() else "cpu")
    dtype = args.dtype or ("float32" if device == "cpu" else "bfloat16")
    model_dir = str(Path(args.model or ensure_tiny_model("qwen3", progress=say)).resolve())
    prompts = Prompts(model_dir, args.prompt_len, args.seed)
    result: dict[str, Any] = {
        "command": "python -m bench " + " ".join(argv), "hardware": hardware(),
        "model_dir": model_dir, "settings": {
            "sides": sides, "plan": plan, "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens, "device": device, "dtype": dtype, "seed": args.seed,
            "engine_options": engine_options},
        "results": {}}
    base = _merge_base(out / f"{stem}.json", result) if args.merge else None
    say(f"[ar] {model_dir} on {device} ({dtype}); sides {', '.join(sides)}; "
        f"(concurrency, bursts) {plan}")
    import uvloop

    with tempfile.TemporaryDirectory() as tmp:
        target = target_for(model_dir, device, Path(tmp), engine_options)
        for side in (s for s in sides if s.startswith("ours") or s == VLLM_SIDE):
            side_target = target if side != VLLM_SIDE else target_for(
                model_dir, device, Path(tmp), None, engine="vllm")
            result["results"][side], info = uvloop.run(measure(
                side, side_target, dtype, args.server_timeout, plan, prompts, args.new_tokens,
                server_log=out / f"{stem}-{side}-server.log"))
            if info and side != VLLM_SIDE:
                result["engine_info"] = info
    from bench.ar_hf import copy_bandwidth
    from bench.ar_report import environment, report

    result["bandwidth"] = copy_bandwidth(device)
    result["hardware"].update(environment(device))
    hf_sides = [s for s in sides if s.startswith("hf")]
    if hf_sides:
        hf_results, result["transformers_implementation"] = _hf(
            hf_sides, model_dir, device, dtype, plan, prompts, args.new_tokens)
        result["results"].update(hf_results)
    if base is not None:
        result = _merged(base, result)
    out.mkdir(parents=True, exist_ok=True)
    text = report(result)  # adds result["model"] and result["roofline"]
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{stem}.md").write_text(text)
    say(f"[ar] wrote {out / stem}.md")
    return 0
