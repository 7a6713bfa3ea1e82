"""What an AR stage accepts as its prompt, turned into token ids."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from omni.engines.base import EngineLoadError, input_error
from omni.models.causal_lm import CausalLM
from omni.models.hf_causal import apply_chat_template


def prompt_ids(lm: CausalLM, inputs: Mapping[str, Any]) -> list[int]:
    """Token ids of {"prompt": str} | {"prompt_token_ids": [int]} | {"messages": [...]}
    | {upstream_stage: [{"text": ...}, ...]} (full delivery: the upstream text, joined);
    ValueError naming what is wrong otherwise (an InputFieldError naming the request's
    field, prompt_field, when the prompt came in one)."""
    tok, field = lm.tokenizer, prompt_field(inputs)
    if "prompt_token_ids" in inputs:
        ids = inputs["prompt_token_ids"]
        if not isinstance(ids, list | tuple) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise input_error(field, "prompt_token_ids must be a list of integers")
        vocab = lm.vocab_size  # a config lookup: once, not per token (2,500-token prompts)
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise input_error(field, f"prompt_token_ids out of range [0, {vocab}): {bad[:5]}")
        ids = list(ids)
    elif "messages" in inputs:
        ids = apply_chat_template(tok, with_transcripts(inputs["messages"], inputs),
                                  inputs.get("tools"))
    elif "prompt" in inputs:
        if not isinstance(inputs["prompt"], str):
            raise input_error(field, "prompt must be a string")
        ids = tok(inputs["prompt"])["input_ids"]
    elif inputs and all(isinstance(v, list) for v in inputs.values()):
        text = "".join(c.get("text", "") for chunks in inputs.values() for c in chunks
                       if isinstance(c, Mapping))
        ids = tok(text)["input_ids"]
    else:
        raise ValueError("inputs need one of 'prompt', 'prompt_token_ids' or 'messages'")
    if not ids:
        raise input_error(field, "the prompt is empty")
    check_prompt_length(len(ids), None, lm.max_positions, field)
    return [int(i) for i in ids]


def prompt_field(inputs: Mapping[str, Any]) -> str | None:
    """The request field an entry stage's prompt came in, as the API names it: chat's
    ``messages`` (the Responses API renames it ``input``), the completions API's
    ``prompt`` (text or token ids); None for input from upstream stages."""
    if "prompt_token_ids" in inputs or ("prompt" in inputs and "messages" not in inputs):
        return "prompt"
    return "messages" if "messages" in inputs else None


def check_prompt_length(tokens: int, capacity: int | None, context: int | None,
                        field: str | None) -> None:
    """A prompt must leave room for one generated token in the KV cache's ``capacity``
    and the model's ``context`` (both in tokens; None: no limit)."""
    for limit, what in ((capacity, "this stage's KV cache holds"),
                        (context, "the model's limit is")):
        if limit is not None and tokens >= limit:
            raise input_error(field, f"prompt has {tokens} tokens; {what} {limit}")


NOT_UPSTREAM = ("messages", "tools")  # inputs keys the request itself carries


def with_transcripts(messages: Any, inputs: Mapping[str, Any]) -> Any:
    """The chat with each audio placeholder part (``{"type": "input_audio", "input_audio":
    {"transcript": i}}``, the front end's stand-in for a clip a speech stage upstream
    transcribed) replaced by a text part holding the i-th transcript: the text of the
    i-th chunk the upstream stage delivered (full delivery, in order)."""
    texts = [c.get("text", "") for key, chunks in inputs.items() if key not in NOT_UPSTREAM
             and isinstance(chunks, list) for c in chunks if isinstance(c, Mapping)]
    if not isinstance(messages, list):
        return messages
    out = []
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            content = [_transcript_part(part, texts) for part in content]
            message = {**message, "content": content}
        out.append(message)
    return out


def _transcript_part(part: Any, texts: list[str]) -> Any:
    if not isinstance(part, Mapping) or part.get("type") != "input_audio":
        return part
    audio = part.get("input_audio")
    if not isinstance(audio, Mapping) or "transcript" not in audio:
        return part
    index = audio["transcript"]
    if not isinstance(index, int) or not 0 <= index < len(texts):
        raise ValueError(f"audio part {index!r} has no transcript ({len(texts)} arrived)")
    return {"type": "text", "text": texts[index].strip()}


def wants_media(lm: CausalLM, inputs: Mapping[str, Any]) -> bool:
    """The prompt holds parts for the model's media encoder (slow: encoded off the loop)."""
    return lm.media is not None and lm.media.wants(inputs.get("messages"))


def encode_prompt(lm: CausalLM, inputs: Mapping[str, Any]) -> tuple[list[int], Any, Any]:
    """(ids, embeddings or None, PromptLayout or None) of an entry request's prompt. Media
    parts (the model's `media` encoder) and given prompt_embeds come as embeddings;
    placeholder ids stand for prompt_embeds (never fed: the embeddings are)."""
    if wants_media(lm, inputs):
        return lm.media.encode(inputs["messages"], inputs.get("tools"))
    embeds = prompt_embeds(lm, inputs)
    if embeds is not None:
        return [0] * embeds.shape[0], embeds, None
    return prompt_ids(lm, inputs), None, None


def encode_prompts(lm: CausalLM, batch: list[Mapping[str, Any]]) -> list[Any]:
    """encode_prompt of several media prompts at once: per prompt its result or the
    exception it raised. A model whose media encoder batches (``encode_batch``) gets them
    in one call (one vision-tower pass for all their images)."""
    many = getattr(lm.media, "encode_batch", None)
    if many is not None:
        return _encode_batched(many, [(inputs["messages"], inputs.get("tools"))
                                      for inputs in batch])
    out: list[Any] = []
    for inputs in batch:
        try:
            out.append(encode_prompt(lm, inputs))
        except Exception as e:  # this request fails alone
            out.append(e)
    return out


def _encode_batched(many: Any, prompts: list[Any]) -> list[Any]:
    """One batched call; when it raises as a whole (one prompt's image failed the shared
    tower call: one the release's processor refuses, memory), each prompt is encoded
    alone, so only the prompt at fault fails."""
    try:
        return many(prompts)
    except Exception as e:
        if len(prompts) == 1:
            return [e]
    return [_encode_batched(many, [prompt])[0] for prompt in prompts]


def prompt_embeds(lm: CausalLM, inputs: Mapping[str, Any]) -> torch.Tensor | None:
    """inputs {"prompt_embeds": (tokens, hidden) tensor}: the prompt as embeddings (e.g.
    made by an upstream encoder); None when not given. The AR engine keeps such prompts
    out of the prefix cache (their placeholder ids say nothing about the content)."""
    embeds = inputs.get("prompt_embeds")
    if embeds is None:
        return None
    hidden = lm.config.hidden_size
    if not isinstance(embeds, torch.Tensor) or embeds.dim() != 2 \
            or embeds.shape[1] != hidden or embeds.shape[0] < 1:
        raise ValueError(f"prompt_embeds must be a (tokens, {hidden}) tensor")
    if not torch.isfinite(embeds).all():
        raise ValueError("prompt_embeds holds NaN or infinite values")
    return embeds.to(lm.device, lm.dtype)


def stream_producer(inputs: Mapping[str, Any]) -> str | None:
    """The one producer stage a stream-fed request takes its prompt from, else None."""
    if "stream" not in inputs:
        return None
    producers = inputs["stream"]
    if not isinstance(producers, list) or len(producers) != 1 or not isinstance(producers[0], str):
        raise ValueError(f"'stream' must name exactly one producer stage, got {producers!r}")
    return producers[0]


def take_chunk(lm: CausalLM, prompt: list[int], data: Mapping[str, Any]) -> str:
    """One stream chunk: token ids extend prompt in place; text is returned, to be
    tokenized with the rest when the stream ends (partial text tokenizes differently)."""
    ids, text = data.get("token_ids"), data.get("text")
    if ids is not None:
        if not isinstance(ids, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) and 0 <= i < lm.vocab_size
                for i in ids):
            raise ValueError("token_ids must be a list of valid token ids")
        prompt += ids
        return ""
    if isinstance(text, str):
        return text
    if data:
        raise ValueError("a stream chunk needs 'token_ids' or 'text'")
    return ""


def export_layers(lm: CausalLM, value: Any) -> list[int] | None:
    """Option export_hidden_layers: indices into transformers' hidden_states (0 =
    embeddings, negative from the end), or "auto" = what the model's next stage reads."""
    if value == "auto":
        value = lm.export_layers
    if value is None:
        return None
    total = lm.config.num_hidden_layers + 1
    if not isinstance(value, list) or not value or not all(
            isinstance(i, int) and not isinstance(i, bool) and -total <= i < total
            for i in value):
        raise EngineLoadError(f"option export_hidden_layers must be a list of layer "
                              f"indices in [{-total}, {total}) or auto, got {value!r}")
    return [i % total for i in value]


def hidden_exports(lm: CausalLM, value: Any) -> tuple[list[int] | None, bool]:
    """(export_layers of the option, whether only the prompt's rows are exported): "auto"
    exports what the next stage reads, for some models the prompt's rows only."""
    layers = export_layers(lm, value)
    return layers, layers is not None and lm.export_prompt_only and value == "auto"


def logprobs_entry(tokenizer: Any, lp: Any) -> dict[str, Any]:
    """One token's logprobs as the APIs report them (each token's own text)."""
    def decode(token: int) -> str:
        return tokenizer.decode([token], skip_special_tokens=False)

    return {"token_id": lp.token, "token": decode(lp.token), "logprob": lp.logprob,
            "top": [{"token_id": t, "token": decode(t), "logprob": v} for t, v in lp.top]}
