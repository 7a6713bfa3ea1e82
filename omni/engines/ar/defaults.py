"""A request's defaults in an AR stage, lowest first: the model's generation_config.json
sampling fields (``CausalLM.sampling_defaults``), then what the pipeline sets (the stage's
``params`` and the pipeline's ``defaults:``, merged by the orchestrator into the request's
params), then the request's own fields (docs/pipeline.md, "Request defaults").

``system_prompt`` (a string param, usually set by a pipeline) is the chat's system message
when the request's messages bring none of their own: a client's system message replaces it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omni.engines.ar.sampling import SamplingParams
from omni.engines.base import EngineLoadError

SYSTEM_ROLES = ("system", "developer")  # OpenAI's newer name for the system message
# an answer's length when neither the request, the pipeline nor the model sets one: long
# enough for any answer a chat model gives (the context's end still stops it, "length"),
# bounded so a model that never ends does not hold a slot for its whole context. (The
# Python SamplingParams keeps vLLM's 16 for callers that build params themselves.)
DEFAULT_MAX_TOKENS = 4096


def model_defaults(model_dir: str, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The model's sampling defaults, checked once at load: a bad value fails the load."""
    try:
        SamplingParams.from_dict(defaults)
    except ValueError as e:
        raise EngineLoadError(f"model directory {model_dir}: generation_config.json: {e}") from e
    return dict(defaults)


def request_sampling(defaults: Mapping[str, Any], params: Mapping[str, Any]) -> SamplingParams:
    """A request's sampling params: its own (None = unset) over the model's defaults."""
    merged = {"max_tokens": DEFAULT_MAX_TOKENS, **defaults}
    merged.update({k: v for k, v in params.items() if v is not None})
    return SamplingParams.from_dict(merged)


def with_system_prompt(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> Mapping[str, Any]:
    """The chat with the ``system_prompt`` param as its first message, unless it has a
    system message already (or is not a chat, or no system prompt is set)."""
    prompt = params.get("system_prompt")
    messages = inputs.get("messages")
    if prompt is None or not isinstance(messages, list):
        return inputs
    if not isinstance(prompt, str):
        raise ValueError(f"system_prompt must be a string, got {type(prompt).__name__}")
    if not prompt or any(isinstance(m, Mapping) and m.get("role") in SYSTEM_ROLES
                         for m in messages):
        return inputs
    return {**inputs, "messages": [{"role": "system", "content": prompt}, *messages]}
