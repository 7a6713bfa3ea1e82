"""What an AR stage accepts as its prompt, turned into token ids."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omni.models.hf_causal import CausalLM, apply_chat_template


def prompt_ids(lm: CausalLM, inputs: Mapping[str, Any]) -> list[int]:
    """Token ids of {"prompt": str} | {"prompt_token_ids": [int]} | {"messages": [...]}
    | {upstream_stage: [{"text": ...}, ...]} (full delivery: the upstream text, joined);
    ValueError naming what is wrong otherwise."""
    tok = lm.tokenizer
    if "prompt_token_ids" in inputs:
        ids = inputs["prompt_token_ids"]
        if not isinstance(ids, list | tuple) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ValueError("prompt_token_ids must be a list of integers")
        bad = [i for i in ids if not 0 <= i < lm.vocab_size]
        if bad:
            raise ValueError(f"prompt_token_ids out of range [0, {lm.vocab_size}): {bad[:5]}")
        ids = list(ids)
    elif "messages" in inputs:
        ids = apply_chat_template(tok, inputs["messages"])
    elif "prompt" in inputs:
        if not isinstance(inputs["prompt"], str):
            raise ValueError("prompt must be a string")
        ids = tok(inputs["prompt"])["input_ids"]
    elif inputs and all(isinstance(v, list) for v in inputs.values()):
        text = "".join(c.get("text", "") for chunks in inputs.values() for c in chunks
                       if isinstance(c, Mapping))
        ids = tok(text)["input_ids"]
    else:
        raise ValueError("inputs need one of 'prompt', 'prompt_token_ids' or 'messages'")
    if not ids:
        raise ValueError("the prompt is empty")
    limit = lm.max_positions
    if limit is not None and len(ids) >= limit:
        raise ValueError(f"prompt has {len(ids)} tokens; the model's limit is {limit}")
    return [int(i) for i in ids]
