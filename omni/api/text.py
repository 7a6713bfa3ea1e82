"""/v1/completions, and the text answers of /v1/chat/completions (omni/api/chat.py),
non-stream and SSE.

``n`` choices run as n requests of the pipeline at once (they share the prompt's KV
blocks through the AR engine's prefix cache); with a ``seed``, choice i uses seed + i, so
the choices differ and each is reproducible. Logprobs come from the engine's outputs
(the model's own distribution) and are shaped per endpoint: chat's ``content`` list or
the completions API's parallel arrays.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

from aiohttp import web

from omni.api.errors import APIError, read_json
from omni.api.schemas import parse
from omni.api.schemas.response_format import check_response_format
from omni.api.schemas.text import ChatCompletionRequest, CompletionRequest
from omni.api.state import MODELS_KEY, ServedModel
from omni.api.text_result import TextResult, usage
from omni.api.text_stream import close_all, stream_answer
from omni.api.tools import CallStream, ToolPlan, check_tool_history, plan_tools
from omni.models.tool_calls import call_grammar


def _text_model(request: web.Request, body: dict[str, Any]) -> ServedModel:
    model = request.app[MODELS_KEY].get(body.get("model"))
    if "text" not in model.modalities:
        raise APIError(400, f"model '{model.id}' does not output text (it outputs "
                       f"{', '.join(model.modalities)})", param="model")
    if "text" not in model.input_modalities:
        hint = (" (a speech recognizer: use /v1/audio/transcriptions)"
                if "audio" in model.input_modalities else "")
        raise APIError(400, f"model '{model.id}' does not read text (it takes "
                       f"{', '.join(model.input_modalities) or 'nothing'}){hint}",
                       param="model")
    return model


def _chat_logprobs(entries: list[dict[str, Any]]) -> dict[str, Any]:
    def one(e: dict[str, Any]) -> dict[str, Any]:
        return {"token": e["token"], "logprob": e["logprob"], "bytes": list(e["token"].encode())}
    return {"content": [{**one(e), "top_logprobs": [one(t) for t in e["top"]]}
                        for e in entries], "refusal": None}


def _completion_logprobs(entries: list[dict[str, Any]], offset: int) -> dict[str, Any]:
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e["token"])
    return {"tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top"]} for e in entries],
            "text_offset": offsets}


# inputs beside the messages, per request (omni/api/chat_media.py)
EXTRA_INPUTS = web.RequestKey("omni_extra_inputs", dict)


class TextCall:
    """One text request: runs its choices, and shapes them for its endpoint. ``body`` is
    the raw JSON that ``req`` was validated from: chat messages go to the engine as sent
    (with the fields this server does not declare), after chat_media.py rewrote their
    media parts in place. ``call_id``: the endpoint's own id (the Responses API's
    ``resp_...``) instead of a chat or completion id."""

    def __init__(self, request: web.Request, body: dict[str, Any],
                 req: ChatCompletionRequest | CompletionRequest,
                 call_id: str | None = None) -> None:
        chat = isinstance(req, ChatCompletionRequest)
        self.request, self.body, self.req, self.chat = request, body, req, chat
        self.model = _text_model(request, body)
        self.inputs = {"messages": body["messages"]} if chat else req.inputs()
        # clips a speech stage upstream transcribes (omni/api/chat_media.py)
        self.inputs.update(request.get(EXTRA_INPUTS, {}))
        self.input_modalities = ["text", *(["audio"] if "audio" in self.inputs else [])]
        self.sampling = req.sampling()
        self.n = req.choices
        self.logprobs = req.logprobs_count()
        if self.logprobs is not None:
            self.sampling["logprobs"] = self.logprobs
        prefix = "chatcmpl" if chat else "cmpl"
        # our own id inside (a client's X-Request-Id need not be unique); theirs is echoed
        self.id = call_id or f"{prefix}-{uuid.uuid4().hex}"
        self.client_request_id = request.headers.get("X-Request-Id") or self.id
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        self.tools: ToolPlan | None = None

    async def plan_tools(self) -> None:
        """The request's tools into the engine's inputs and params (omni/api/tools.py)."""
        req = self.req
        check_tool_history(self.body["messages"])
        if req.tools is None and req.tool_choice is None:
            return
        self.use_tools(await plan_tools(
            self.model, [t.function for t in req.tools or ()], req.tool_choice,
            req.parallel_tool_calls, lambda i: f"tools[{i}].function.parameters"))

    def use_tools(self, plan: ToolPlan) -> None:
        """Run with ``plan`` (its tools in the prompt, its call grammar in the sampler),
        after the answer's schema is set: a required call is the whole answer, so the
        schema (for a text answer) goes; with auto the answer is that schema's JSON or
        calls (one grammar of both)."""
        schema = self.sampling.get("json_schema")
        if plan.grammar is not None and schema is not None:
            del self.sampling["json_schema"]
            if plan.mode == "auto":
                plan.grammar = call_grammar(plan.grammar_functions, plan.parallel, optional=True,
                                            answer_schema=schema)
        self.tools = plan
        plan.apply(self.inputs, self.sampling)

    def stream(self, index: int) -> Any:
        """Choice ``index``, admitted now (AsyncOmni.submit): its outputs, to read and
        close (``contextlib.aclosing``)."""
        params = dict(self.sampling)
        if self.n > 1 and "seed" in params:
            params["seed"] += index
        request_id = self.id if self.n == 1 else f"{self.id}-{index}"
        return self.model.omni.submit(self.inputs, modalities=["text"], params={"*": params},
                                      request_id=request_id,
                                      input_modalities=self.input_modalities)

    async def submit_all(self) -> list[Any]:
        """Every choice admitted here, in the handler's own step, not in the tasks that
        read them: a task's first step waits behind all the loop had queued, which in a
        burst of image chats is every other request's body read and base64 decode
        (omni/runtime/submitted.py). One refused: those before it are aborted."""
        streams = []
        try:
            for index in range(self.n):
                streams.append(self.stream(index))
        except BaseException:
            await close_all(streams)
            raise
        return streams

    def _logprobs(self, entries: list[dict[str, Any]], offset: int) -> dict[str, Any] | None:
        if self.logprobs is None:
            return None
        return _chat_logprobs(entries) if self.chat else _completion_logprobs(entries, offset)

    def new_result(self) -> TextResult:
        reads_calls = self.tools is not None and self.tools.reads_calls
        return TextResult(calls=CallStream() if reads_calls else None)

    def choice(self, index: int, result: TextResult) -> dict[str, Any]:
        base = {"index": index, "finish_reason": result.reason,
                "logprobs": self._logprobs(result.logprobs, 0)}
        if not self.chat:
            return {**base, "text": result.text}
        message = {"role": "assistant", "content": result.text, "refusal": None}
        if result.calls is not None and result.calls.ids:
            message["content"] = result.calls.content.strip() or None
            message["tool_calls"] = result.calls.tool_calls
        elif result.calls is not None:
            message["content"] = result.calls.content
        return {**base, "message": message}

    def envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model.id,
                "choices": choices}

    def delta_choice(self, index: int, text: str | None, finish: str | None, first: bool,
                     logprobs: list[dict[str, Any]] | None = None,
                     offset: int = 0) -> dict[str, Any]:
        lp = self._logprobs(logprobs, offset) if logprobs else None
        if not self.chat:
            return {"index": index, "text": text or "", "finish_reason": finish, "logprobs": lp}
        delta = {"role": "assistant", "content": ""} if first else {}
        if text:
            delta["content"] = text
        return {"index": index, "delta": delta, "finish_reason": finish, "logprobs": lp}

    def tool_call_choice(self, index: int, tool_call: dict[str, Any]) -> dict[str, Any]:
        return {"index": index, "delta": {"tool_calls": [tool_call]}, "finish_reason": None,
                "logprobs": None}


async def _collect(call: TextCall, stream: Any) -> TextResult:
    result = call.new_result()
    async with contextlib.aclosing(stream) as outputs:
        async for out in outputs:
            if out.data is not None and out.modality == "text":
                result.add(out.data)
    if result.calls is not None:
        result.calls.feed(result.text)
        result.calls.finish()
    return result


async def _complete(call: TextCall) -> web.Response:
    streams = await call.submit_all()
    try:
        async with asyncio.TaskGroup() as group:  # one failing choice cancels the others
            tasks = [group.create_task(_collect(call, s)) for s in streams]
    except ExceptionGroup as failed:  # answer with the first failure's own status
        raise failed.exceptions[0] from None
    finally:  # a task cancelled before its first step never closed its choice
        await close_all(streams)
    results = [t.result() for t in tasks]
    body = call.envelope(call.object, [call.choice(i, r) for i, r in enumerate(results)])
    body["usage"] = usage(results)
    return web.json_response(body, headers={"X-Request-Id": call.client_request_id})


async def completions(request: web.Request) -> web.StreamResponse:
    body = await read_json(request)
    return await respond(TextCall(request, body, parse(CompletionRequest, body)))


async def respond(call: TextCall) -> web.StreamResponse:
    """The text answer to ``call``: one JSON body, or SSE when it asked to stream."""
    schema = await check_response_format(call.req.response_format)
    if schema is not None:  # structured output (omni/engines/ar/grammar.py)
        call.sampling["json_schema"] = schema
    if call.chat:
        await call.plan_tools()
    return await (stream_answer(call) if call.req.stream else _complete(call))


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/completions", completions)
