"""What tool_choice "auto" costs while the model writes plain text: the call grammar's
optional form (omni/models/tool_calls.py) masks every step, so its fill time for a batch
of rows writing English is the price. Prints the median and p90 fill of 8 rows' bitmasks
(llguidance's thread pool) over a paragraph of text.

    OMP_NUM_THREADS=1 python bench/probes/auto_tool_mask.py [--tokenizer DIR] [--batch 8]

--tokenizer defaults to SmolLM2 converted by the default server (~/.cache/omni/models/smollm2).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

TEXT = "The weather in Paris is usually mild in spring, with rain showers and sunny spells. "
TOOLS = [{"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}}, "required": ["city"]}}]


def main() -> None:
    import llguidance
    import llguidance.hf
    import llguidance.torch as llt
    from transformers import AutoTokenizer

    from omni.models.tool_calls import call_grammar
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default=str(Path.home() / ".cache/omni/models/smollm2"))
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    lltok = llguidance.hf.from_tokenizer(tok, n_vocab=len(tok))
    grammar = llguidance.LLMatcher.grammar_from_lark(call_grammar(TOOLS, True, optional=True))
    matchers = [llguidance.LLMatcher(lltok, grammar, log_level=0) for _ in range(args.batch)]
    executor = llguidance.LLExecutor()
    mask = torch.full((args.batch, (len(tok) + 31) // 32), -1, dtype=torch.int32)
    fills = []
    for token in tok(TEXT * 3, add_special_tokens=False)["input_ids"]:
        started = time.perf_counter()
        llt.fill_next_token_bitmask_par(executor, [(m, i) for i, m in enumerate(matchers)], mask)
        fills.append(time.perf_counter() - started)
        for m in matchers:
            assert m.consume_token(token), m.get_error()  # plain text stays allowed
    fills.sort()
    print(json.dumps({"tokenizer": Path(args.tokenizer).name, "vocab": len(tok),
                      "batch": args.batch, "steps": len(fills),
                      "fill_median_ms": round(fills[len(fills) // 2] * 1e3, 3),
                      "fill_p90_ms": round(fills[int(0.9 * len(fills))] * 1e3, 3)}))


if __name__ == "__main__":
    main()
