"""Checking the sampling fields of /v1/completions and /v1/chat/completions.

Every field is validated here with a 400 naming it; the engine (omni/engines/ar/sampling.py)
checks again, so a pipeline driven from Python gets the same rules.
"""

from __future__ import annotations

import math
from typing import Any

from omni.api.errors import APIError

MAX_N = 16
# field -> (engine param, min, max), numbers
FLOAT_FIELDS = {
    "temperature": ("temperature", 0.0, 2.0), "top_p": ("top_p", 1e-9, 1.0),
    "min_p": ("min_p", 0.0, 1.0), "presence_penalty": ("presence_penalty", -2.0, 2.0),
    "frequency_penalty": ("frequency_penalty", -2.0, 2.0),
    "repetition_penalty": ("repetition_penalty", 1e-3, 10.0),
}
# field -> (engine param, min); max_completion_tokens is chat's newer name for max_tokens
INT_FIELDS = {"max_tokens": ("max_tokens", 1), "max_completion_tokens": ("max_tokens", 1),
              "min_tokens": ("min_tokens", 0), "top_k": ("top_k", -1), "seed": ("seed", 0)}


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or not low <= value <= high:
        raise APIError(400, f"'{name}' must be a number in [{low:g}, {high:g}], got {value!r}",
                       param=name)
    return float(value)


def _integer(body: dict[str, Any], name: str, low: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low or value >= 2**63:
        raise APIError(400, f"'{name}' must be an integer >= {low}, got {value!r}", param=name)
    return value


def _stop(stop: Any) -> dict[str, Any]:
    if stop is None:
        return {}
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) \
            or len(stops) > 16:
        raise APIError(400, "'stop' must be a non-empty string or a list of up to 16 of them",
                       param="stop")
    return {"stop": stops}


def _stop_token_ids(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
        raise APIError(400, "'stop_token_ids' must be a list of token ids", param="stop_token_ids")
    return {"stop_token_ids": value}


def sampling_params(body: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI sampling fields (and vLLM-style extras) under our engine's names."""
    params: dict[str, Any] = {}
    for name, (target, low, high) in FLOAT_FIELDS.items():
        value = _number(body, name, low, high)
        if value is not None:
            params[target] = value
    for name, (target, low) in INT_FIELDS.items():
        value = _integer(body, name, low)
        if value is not None:
            params[target] = value
    params.update(_stop(body.get("stop")))
    params.update(_stop_token_ids(body.get("stop_token_ids")))
    if body.get("ignore_eos") is not None:
        if not isinstance(body["ignore_eos"], bool):
            raise APIError(400, "'ignore_eos' must be true or false", param="ignore_eos")
        params["ignore_eos"] = body["ignore_eos"]
    if params.get("min_tokens", 0) > params.get("max_tokens", math.inf):
        raise APIError(400, "'min_tokens' must not exceed 'max_tokens'", param="min_tokens")
    return params


def choice_count(body: dict[str, Any]) -> int:
    n = body.get("n")
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise APIError(400, f"'n' must be an integer in [1, {MAX_N}], got {n!r}", param="n")
    return n


def logprobs_count(body: dict[str, Any], chat: bool) -> int | None:
    """How many alternatives per token to return (0 = just the sampled token's), or None
    when logprobs are not asked for. Chat: logprobs (bool) + top_logprobs (0-20);
    completions: logprobs (int 0-5)."""
    if not chat:
        value = body.get("logprobs")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 5:
            raise APIError(400, f"'logprobs' must be an integer in [0, 5], got {value!r}",
                           param="logprobs")
        return value
    wanted, top = body.get("logprobs"), body.get("top_logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise APIError(400, "'logprobs' must be true or false", param="logprobs")
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
            raise APIError(400, f"'top_logprobs' must be an integer in [0, 20], got {top!r}",
                           param="top_logprobs")
        if not wanted:
            raise APIError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return (top or 0) if wanted else None
