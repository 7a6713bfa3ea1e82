"""Per-step grammar mask cost, xgrammar vs llguidance: a batch of constrained sequences
(a realistic json_schema) walked token by token through a valid JSON answer; each step
fills every row's token bitmask, applies it to (B, V) logits on --device and advances each
matcher. Prints the compile time and the per-step medians (fill, apply, advance) for each
library and tokenizer (the tiny Qwen3 fixture's; SmolLM2's if converted under
~/.cache/omni/models/smollm2), and whether each lets a raw control character into a
string with a maxLength (xgrammar 0.2.9 does). Behind the choice in
omni/engines/ar/grammar.py.

    OMP_NUM_THREADS=1 python bench/probes/grammar_mask.py [--device cuda] [--batch 8]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "address": {"type": "object", "properties": {
            "street": {"type": "string"}, "city": {"type": "string"},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["street", "city", "zip"], "additionalProperties": False},
        "status": {"enum": ["active", "inactive", "pending"]},
        "score": {"type": "number"},
    },
    "required": ["name", "age", "email", "tags", "address", "status", "score"],
    "additionalProperties": False,
}
ANSWER = {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org",
          "tags": ["math", "engines", "poetry"],
          "address": {"street": "12 St James's Square", "city": "London", "zip": "10001"},
          "status": "active", "score": 99.5}


def tokenizers(extra: str | None) -> dict[str, Path]:
    from omni.fixtures.tiny_models import build_tiny_qwen3
    found = {"tiny-qwen3": build_tiny_qwen3(Path(tempfile.mkdtemp()) / "qwen3")}
    if extra:  # e.g. a real-size random model's directory (scripts/build_random_model.py)
        found[Path(extra).name] = Path(extra)
    smol = Path.home() / ".cache/omni/models/smollm2"
    if (smol / "tokenizer.json").exists():
        found["smollm2"] = smol
    return found


def run_xgrammar(tok, vocab: int, ids: list[int], batch: int, dev: torch.device) -> dict:
    import xgrammar as xgr
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    t0 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    compile_s = time.perf_counter() - t0
    matchers = [xgr.GrammarMatcher(compiled) for _ in range(batch)]
    mask = xgr.allocate_token_bitmask(batch, info.vocab_size)

    def fill() -> None:
        for i, m in enumerate(matchers):
            m.fill_next_token_bitmask(mask, i)

    def advance(t: int) -> None:
        for m in matchers:
            assert m.accept_token(t)

    return _walk(compile_s, fill, lambda lg: xgr.apply_token_bitmask_inplace(
        lg, mask.to(dev, non_blocking=True)), advance, ids, batch, vocab, dev)


def run_llguidance(tok, vocab: int, ids: list[int], batch: int, dev: torch.device) -> dict:
    import llguidance
    import llguidance.hf
    import llguidance.torch as llt
    lltok = llguidance.hf.from_tokenizer(tok, n_vocab=vocab)
    t0 = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        SCHEMA, defaults={"whitespace_flexible": False, "item_separator": ", ",
                         "key_separator": ": "})
    matchers = [llguidance.LLMatcher(lltok, grammar) for _ in range(batch)]
    assert not matchers[0].is_error(), matchers[0].get_error()
    compile_s = time.perf_counter() - t0  # lazy: the first masks build the rest
    mask = llt.allocate_token_bitmask(batch, lltok.vocab_size)
    executor = llguidance.LLExecutor()

    def fill() -> None:
        llt.fill_next_token_bitmask_par(executor, [(m, i) for i, m in enumerate(matchers)],
                                        mask)

    def advance(t: int) -> None:
        for m in matchers:
            assert m.consume_token(t), m.get_error()

    return _walk(compile_s, fill, lambda lg: llt.apply_token_bitmask_inplace(
        lg, mask.to(dev, non_blocking=True)), advance, ids, batch, vocab, dev)


def _walk(compile_s, fill, apply, advance, ids, batch, vocab, dev) -> dict:
    fills, applies, advances = [], [], []
    logits = torch.randn(batch, vocab, device=dev)
    for t in ids:
        t0 = time.perf_counter()
        fill()
        t1 = time.perf_counter()
        apply(logits)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        advance(t)
        t3 = time.perf_counter()
        fills.append(t1 - t0)
        applies.append(t2 - t1)
        advances.append(t3 - t2)
    ms = lambda xs: round(statistics.median(xs[1:]) * 1e3, 3)  # noqa: E731 (step 0: warm)
    return {"compile_ms": round(compile_s * 1e3, 1), "steps": len(ids),
            "fill_ms": ms(fills), "fill_p90_ms": round(sorted(fills)[int(.9 * len(fills))] * 1e3, 3),
            "apply_ms": ms(applies), "advance_ms": ms(advances),
            "first_fill_ms": round(fills[0] * 1e3, 2)}


def control_char_in_bounded_string(tok, vocab: int) -> dict:
    """Whether each library lets '"<U+000F>"' through {"type": "string", "maxLength": 10}:
    not JSON (json.loads refuses a raw control character in a string)."""
    import llguidance
    import llguidance.hf
    import xgrammar as xgr
    schema = {"type": "string", "maxLength": 10}
    ids = tok('"\x0f"', add_special_tokens=False)["input_ids"]
    xg = xgr.GrammarMatcher(xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(
        tok, vocab_size=vocab)).compile_json_schema(json.dumps(schema)))
    ll = llguidance.LLMatcher(llguidance.hf.from_tokenizer(tok, n_vocab=vocab),
                              llguidance.LLMatcher.grammar_from_json_schema(schema))
    return {"xgrammar_accepts": all(xg.accept_token(t) for t in ids),
            "llguidance_accepts": all(ll.consume_token(t) for t in ids)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokenizer", default=None, help="another model directory's tokenizer")
    args = ap.parse_args()
    from transformers import AutoConfig, AutoTokenizer
    dev = torch.device(args.device)
    text = json.dumps(ANSWER)  # both libraries default to ", " and ": " when not flexible
    for name, path in tokenizers(args.tokenizer).items():
        tok = AutoTokenizer.from_pretrained(path)
        vocab = AutoConfig.from_pretrained(path).vocab_size
        ids = tok(text, add_special_tokens=False)["input_ids"]
        libs = [lib for lib in ("xgrammar", "llguidance") if importlib.util.find_spec(lib)]
        if len(libs) == 2:
            print(json.dumps({"tokenizer": name, "control_char_in_maxLength_string":
                              control_char_in_bounded_string(tok, vocab)}))
        for lib, fn in (("xgrammar", run_xgrammar), ("llguidance", run_llguidance)):
            if lib not in libs:
                print(json.dumps({"lib": lib, "skipped": "not installed"}))
                continue
            print(json.dumps({"tokenizer": name, "vocab": vocab, "lib": lib, "batch": args.batch,
                              "device": args.device, **fn(tok, vocab, ids, args.batch, dev)}))


if __name__ == "__main__":
    main()
