"""/v1/completions and /v1/chat/completions (text out), non-stream and SSE."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from omni.api.app import MODELS_KEY, ServedModel
from omni.api.errors import APIError, read_json, sse_error_event
from omni.api.streams import first_output, next_with_pings, sse_data, start_sse

SAMPLING_RANGES = {  # field -> (min, max) inclusive
    "temperature": (0.0, 2.0), "top_p": (1e-9, 1.0),
}
# OpenAI fields the AR engine does not implement yet: refused unless neutral, never ignored
NOT_YET = {"presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1, "min_p": 0}
# request field -> engine param (max_completion_tokens is chat's newer name for max_tokens)
INT_FIELDS = {"max_tokens": "max_tokens", "max_completion_tokens": "max_tokens",
              "top_k": "top_k", "seed": "seed"}


@dataclass
class TextResult:
    """What a finished text request produced, accumulated from its outputs."""

    text: str = ""
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)

    def add(self, data: dict[str, Any]) -> str:
        delta = data.get("text", "") or ""
        self.text += delta
        self.prompt_tokens = data.get("prompt_tokens", self.prompt_tokens)
        self.completion_tokens += len(data.get("token_ids", ()))
        self.finish_reason = data.get("finish_reason") or self.finish_reason
        return delta

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


def sampling_params(body: dict[str, Any]) -> dict[str, Any]:
    """Validate the OpenAI sampling fields and return them under our names."""
    params: dict[str, Any] = {}
    for name, (low, high) in SAMPLING_RANGES.items():
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not low <= value <= high:
                raise APIError(400, f"'{name}' must be a number in [{low:g}, {high:g}], got "
                               f"{value!r}", param=name)
            params[name] = float(value)
    for name, target in INT_FIELDS.items():
        value = body.get(name)
        if value is not None:
            low = 1 if target == "max_tokens" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise APIError(400, f"'{name}' must be an integer >= {low}, got {value!r}",
                               param=name)
            params[target] = value
    params.update(_stop_param(body.get("stop")))
    if body.get("ignore_eos") is not None:
        params["ignore_eos"] = bool(body["ignore_eos"])
    _refuse_unsupported(body)
    return params


def _stop_param(stop: Any) -> dict[str, Any]:
    if stop is None:
        return {}
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) \
            or len(stops) > 16:
        raise APIError(400, "'stop' must be a non-empty string or a list of up to 16 of them",
                       param="stop")
    return {"stop": stops}


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for name, neutral in NOT_YET.items():
        if body.get(name) not in (None, neutral):
            raise APIError(400, f"'{name}' is not supported by this server yet (only "
                           f"{neutral})", param=name)
    n = body.get("n")
    if n is not None and n != 1:
        raise APIError(400, f"'n' must be 1 on this server (got {n!r})", param="n")
    if body.get("logprobs"):
        raise APIError(400, "'logprobs' is not supported by this server yet", param="logprobs")


def _text_model(request: web.Request, body: dict[str, Any]) -> ServedModel:
    model = request.app[MODELS_KEY].get(body.get("model"))
    if "text" not in model.modalities:
        raise APIError(400, f"model '{model.id}' does not output text (it outputs "
                       f"{', '.join(model.modalities)})", param="model")
    return model


def _completion_inputs(body: dict[str, Any]) -> dict[str, Any]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return {"prompt": prompt}
    if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
        return {"prompt_token_ids": prompt}
    raise APIError(400, "'prompt' must be a string or a list of token ids", param="prompt")


def _chat_inputs(body: dict[str, Any]) -> dict[str, Any]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' must be a non-empty list", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
                or not isinstance(message.get("content"), str | list):
            raise APIError(400, f"messages[{i}] needs a string 'role' and a 'content'",
                           param=f"messages[{i}]")
    return {"messages": messages}


class TextCall:
    """One text request: runs it, and shapes it as a completion or a chat completion."""

    def __init__(self, request: web.Request, body: dict[str, Any], chat: bool) -> None:
        self.request, self.body, self.chat = request, body, chat
        self.model = _text_model(request, body)
        self.inputs = _chat_inputs(body) if chat else _completion_inputs(body)
        self.params = {"*": sampling_params(body)}
        prefix = "chatcmpl" if chat else "cmpl"
        # our own id inside (a client's X-Request-Id need not be unique); theirs is echoed
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.client_request_id = request.headers.get("X-Request-Id") or self.id
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"

    def stream(self) -> Any:
        return self.model.omni.generate(self.inputs, modalities=["text"], params=self.params,
                                        request_id=self.id)

    def choice(self, result: TextResult) -> dict[str, Any]:
        base = {"index": 0, "finish_reason": result.finish_reason, "logprobs": None}
        if self.chat:
            return {**base, "message": {"role": "assistant", "content": result.text,
                                        "refusal": None}}
        return {**base, "text": result.text}

    def envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model.id,
                "choices": choices}

    def delta_choice(self, text: str | None, finish: str | None, first: bool) -> dict[str, Any]:
        if not self.chat:
            return {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        delta = {"role": "assistant", "content": ""} if first else {}
        if text:
            delta["content"] = text
        return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}


async def _complete(call: TextCall) -> web.Response:
    result = TextResult()
    async with contextlib.aclosing(call.stream()) as outputs:
        async for out in outputs:
            if out.data is not None and out.modality == "text":
                result.add(out.data)
    body = call.envelope(call.object, [call.choice(result)])
    body["usage"] = result.usage()
    return web.json_response(body, headers={"X-Request-Id": call.client_request_id})


async def _stream(call: TextCall) -> web.StreamResponse:
    chunk_object = "chat.completion.chunk" if call.chat else "text_completion"
    include_usage = bool((call.body.get("stream_options") or {}).get("include_usage"))
    outputs = call.stream()
    first = await first_output(outputs)  # errors before the 200 become proper statuses
    response = await start_sse(call.request, call.client_request_id)
    send = _sse_sender(response, include_usage)
    result = TextResult()
    try:
        async with contextlib.aclosing(outputs):
            await send(call.envelope(chunk_object, [call.delta_choice(None, None, True)]))
            item = first
            while item is not None and not item.finished:
                if item.data is not None and item.modality == "text":
                    delta = result.add(item.data)
                    if delta:
                        await send(call.envelope(chunk_object,
                                                 [call.delta_choice(delta, None, False)]))
                item = await next_with_pings(outputs, response)
        await send(call.envelope(chunk_object,
                                 [call.delta_choice(None, result.finish_reason, False)]))
        if include_usage:
            await send({**call.envelope(chunk_object, []), "usage": result.usage()})
        await response.write(b"data: [DONE]\n\n")
    except (ConnectionResetError, ConnectionError):
        raise  # the client left; aclosing already aborted the request
    except Exception as exc:
        await response.write(sse_error_event(exc))
    return response


def _sse_sender(response: web.StreamResponse,
                include_usage: bool) -> Callable[[dict[str, Any]], Any]:
    async def send(payload: dict[str, Any]) -> None:
        if include_usage:  # OpenAI: every chunk carries usage, null until the last one
            payload.setdefault("usage", None)
        await response.write(sse_data(payload))
    return send


async def completions(request: web.Request) -> web.StreamResponse:
    call = TextCall(request, await read_json(request), chat=False)
    return await (_stream(call) if call.body.get("stream") else _complete(call))


async def chat_completions(request: web.Request) -> web.StreamResponse:
    call = TextCall(request, await read_json(request), chat=True)
    return await (_stream(call) if call.body.get("stream") else _complete(call))


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
