"""Decode throughput of a batch of constrained (json_schema) rows against free rows,
through the AR engine in-process (omni/engines/ar/grammar.py): B requests added at once,
the prefill step left out, then output tokens / seconds of the decode steps while all B
rows run. Free rows ignore the end token; constrained rows follow a schema with long
string fields so they decode as long. Alternates free and constrained runs ROUNDS times;
prints each run and the medians.

    OMP_NUM_THREADS=1 python bench/probes/structured_decode.py [--device cuda] \
        [--model DIR] [--batch 8] [--tokens 64] [--rounds 3]

--model defaults to SmolLM2 converted by the default server (~/.cache/omni/models/smollm2)
if there, else (or with --model tiny) the tiny Qwen3 fixture. Every constrained answer
must parse as JSON (a run that overlaps steps, CUDA's default, checks the mask order).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string", "minLength": 200, "maxLength": 400},
    "summary": {"type": "string", "minLength": 200, "maxLength": 400},
    "rating": {"type": "integer", "minimum": 1, "maximum": 5},
    "tags": {"type": "array", "items": {"enum": ["news", "sport", "tech"]}, "maxItems": 3}},
    "required": ["title", "summary", "rating", "tags"], "additionalProperties": False}
PROMPT = "Write a short JSON review of a film about a robot learning to paint."


def default_model(name: str | None) -> str:
    smol = Path.home() / ".cache/omni/models/smollm2"
    if name not in (None, "tiny"):
        return name
    if name is None and (smol / "config.json").exists():
        return str(smol)
    from omni.fixtures import build_tiny_qwen3
    return str(build_tiny_qwen3(Path(tempfile.mkdtemp()) / "qwen3"))


def decode_rate(engine, batch: int, tokens: int, constrained: bool, tag: str) -> float:
    from omni.engines.base import EngineRequest
    params = {"max_tokens": tokens, "temperature": 0.8, "seed": 1}
    if constrained:
        params["json_schema"] = json.dumps(SCHEMA)
    else:
        params["ignore_eos"] = True
    for i in range(batch):
        engine.add(EngineRequest(f"{tag}-{i}", {"prompt": f"{PROMPT} ({i})"}, dict(params, seed=i)))
    running = set(range(batch))
    texts = {i: "" for i in range(batch)}
    made, spent, first = 0, 0.0, True
    while engine.has_work():
        started = time.perf_counter()
        outs = engine.step()
        took = time.perf_counter() - started
        full = len(running) == batch
        for o in outs:
            if o.error:
                raise RuntimeError(o.error)
            texts[int(o.request_id.rsplit("-", 1)[1])] += o.data["text"] if o.data else ""
            if o.finished and o.data and o.data["finish_reason"] == "stop" and constrained:
                json.loads(texts[int(o.request_id.rsplit("-", 1)[1])])  # must be JSON
            if o.finished:
                running.discard(int(o.request_id.rsplit("-", 1)[1]))
        if first:  # the prefill step (and its first tokens)
            first = False
            continue
        if full:
            made += sum(len(o.data["token_ids"]) for o in outs if o.data)
            spent += took
    if engine.runner.inflight is not None or engine.has_work():
        raise RuntimeError("engine did not drain")
    return made / spent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from omni.engines.ar.engine import AREngine
    model = default_model(args.model)
    engine = AREngine(model, device=args.device)
    decode_rate(engine, args.batch, 8, True, "warm-c")  # compile, tokenizer table, kernels
    decode_rate(engine, args.batch, 8, False, "warm-f")
    rates: dict[str, list[float]] = {"free": [], "json_schema": []}
    for r in range(args.rounds):
        for kind in ("free", "json_schema"):
            rate = decode_rate(engine, args.batch, args.tokens, kind == "json_schema",
                               f"{kind}{r}")
            rates[kind].append(rate)
            print(json.dumps({"round": r, "kind": kind, "tok_s": round(rate, 1)}))
    free, constrained = (statistics.median(rates[k]) for k in ("free", "json_schema"))
    print(json.dumps({"model": Path(model).name, "device": args.device, "batch": args.batch,
                      "tokens": args.tokens, "free_tok_s": round(free, 1),
                      "json_schema_tok_s": round(constrained, 1),
                      "ratio": round(constrained / free, 3),
                      # each round's pair ran back to back: less moved by a shared CPU's load
                      "pair_ratio_median": round(statistics.median(
                          c / f for f, c in zip(rates["free"], rates["json_schema"],
                                                strict=True)), 3)}))
    engine.shutdown()


if __name__ == "__main__":
    main()
