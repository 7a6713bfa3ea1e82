"""POST /v1/responses: OpenAI's Responses API for models that answer in text
(protocols.md §10.6-10.9), and GET / DELETE /v1/responses/{response_id} of kept ones.

A request is run as a chat request: its items become chat messages
(omni/api/response_items.py), ``instructions`` a system message before them, the
conversation a ``previous_response_id`` continues between the two; then a `TextCall`
(omni/api/text.py) runs it, with the same engine path, tools (omni/api/tools.py) and
structured output (``text.format``, flat, as chat's response_format) as chat completions.
Sampling extras chat takes (``seed``, ``top_k``, ``stop``...) pass through under the same
names. The answer becomes output items (omni/api/response_output.py), sent whole or as
SSE events numbered from 0: created, in_progress, the items' events, then completed (or
incomplete, when ``max_output_tokens`` cut it). A failure after the stream started is an
``error`` event in both shapes the SDKs read (flat fields and a nested ``error``), then
``response.failed``. A client that leaves aborts the request in every stage. With
``store`` (the default), the response and its conversation are kept
(omni/api/response_store.py); logprobs are not given (``logprobs`` is always []).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import re
import time
import uuid
from typing import Any

from aiohttp import web

from omni.api.chat_media import prepare_media
from omni.api.errors import APIError, from_exception, read_json
from omni.api.response_items import Conversation, called_ids, output_messages, to_messages
from omni.api.response_output import Event, OutputItems
from omni.api.response_store import RESPONSES_KEY, TTL_S, ResponseStore, Stored
from omni.api.schemas import parse
from omni.api.schemas.response_format import check_response_format
from omni.api.schemas.responses import ResponseCreateRequest
from omni.api.schemas.text import ChatCompletionRequest
from omni.api.state import MODELS_KEY
from omni.api.streams import next_with_pings, sse_data, start_sse
from omni.api.text import EXTRA_INPUTS, TextCall
from omni.api.tools import plan_tools
from omni.errors import OmniError, RejectedInputError

log = logging.getLogger("omni.api")

# chat's sampling fields a Responses request may carry as extras (same names, same checks)
SAMPLING_EXTRAS = ("seed", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                   "frequency_penalty", "stop", "stop_token_ids", "ignore_eos", "min_tokens")
TOOL_FIELDS = {"type", "name", "description", "parameters", "strict"}


class ResponseRun:
    """One Responses request: its chat call, the output it builds, the object it answers."""

    def __init__(self, request: web.Request, body: dict[str, Any],
                 req: ResponseCreateRequest, previous: Stored | None) -> None:
        self.request, self.body, self.req = request, body, req
        self.previous = previous  # the kept response previous_response_id continues
        self.history = [] if previous is None else previous.messages
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self.conversation: Conversation = to_messages(req.input, called_ids(self.history))
        self.output = OutputItems()
        self.call: TextCall | None = None
        self.result: Any = None  # the call's TextResult
        self.first_input = 0  # the chat message of the first input item (after system, history)

    async def prepare(self) -> None:
        """The chat call, with its media, schema and tools checked (400s before any run)."""
        system = [] if self.req.instructions is None else [
            {"role": "system", "content": self.req.instructions}]
        messages = [*system, *self.history, *self.conversation.messages]
        if not messages:
            raise APIError(400, "'input' is required (or 'previous_response_id')",
                           param="input")
        media = any(isinstance(m.get("content"), list) for m in messages)
        chat = {"model": self.body.get("model"),
                # chat_media rewrites media parts in place: the kept conversation must not
                "messages": copy.deepcopy(messages) if media else messages,
                **{k: self.body[k] for k in SAMPLING_EXTRAS if k in self.body},
                **{k: v for k, v in (("max_tokens", self.req.max_output_tokens),
                                     ("temperature", self.req.temperature),
                                     ("top_p", self.req.top_p)) if v is not None}}
        self.first_input = len(system) + len(self.history)
        if media:
            await self._media(chat)
        self.call = TextCall(self.request, chat, parse(ChatCompletionRequest, chat), self.id)
        fmt = self.req.text.format if self.req.text is not None else None
        schema = await check_response_format(
            fmt.response_format() if fmt is not None else None, "text.format",
            "text.format.schema")
        if schema is not None:
            self.call.sampling["json_schema"] = schema
        if self.req.tools is not None or self.req.tool_choice is not None:
            self.call.use_tools(await plan_tools(
                self.call.model, self.req.tools or [], self.req.tool_choice,
                self.req.parallel_tool_calls, lambda i: f"tools[{i}].parameters"))
        self.result = self.call.new_result()  # reads calls when the plan has tools

    async def _media(self, chat: dict[str, Any]) -> None:
        """Image parts checked and read as chat's are; a 400 names the input item."""
        model = self.request.app[MODELS_KEY].get(self.body.get("model"))
        try:
            self.request[EXTRA_INPUTS] = await prepare_media(self.request, model, chat)
        except APIError as exc:
            raise self.input_error(exc) from None

    def input_error(self, exc: APIError) -> APIError:
        """``exc`` naming chat's ``messages[k]...`` (the API's media checks, a stage's
        refusal of a part) renamed to the input item it came from."""
        param = _input_param(exc.param, self.first_input, self.conversation.sources)
        if exc.param and param:
            exc.message = exc.message.replace(exc.param, param)
        exc.param = param
        return exc

    def feed(self, out: Any) -> list[Event]:
        """One engine output into the items; the events it caused."""
        if out.data is None or out.modality != "text":
            return []
        return self._items(self.result.add(out.data))

    def feed_whole(self) -> None:
        """The whole answer into the items at once (non-streamed: no events to send)."""
        self._items(self.result.text)

    def _items(self, text: str) -> list[Event]:
        calls = self.result.calls
        parts = calls.feed(text) if calls is not None else ([{"content": text}] if text else [])
        return self.output.parts(parts)

    def finish(self) -> list[Event]:
        calls = self.result.calls
        events = self.output.parts(calls.finish()) if calls is not None else []
        return events + self.output.finish(self.result.finish_reason)

    def response(self, status: str, error: dict[str, Any] | None = None) -> dict[str, Any]:
        """The Response object (§10.7) as it stands."""
        req, done = self.req, status in ("completed", "incomplete")
        fmt = req.text.format if req.text is not None else None
        return {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "background": False, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete" else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "max_tool_calls": None, "model": self.call.model.id,
            "output": copy.deepcopy(self.output.items) if status != "in_progress" else [],
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": None, "summary": None}, "store": req.stores,
            "temperature": req.temperature, "top_p": req.top_p,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True)
                     if fmt is not None else {"type": "text"}},
            "tool_choice": self.body.get("tool_choice", "auto"),
            "tools": [t.model_dump(include=TOOL_FIELDS) for t in req.tools or ()],
            "truncation": "disabled", "user": self.body.get("user"),
            "metadata": req.metadata or {},
            "usage": self._usage() if done else None}

    def final(self) -> dict[str, Any]:
        status = "incomplete" if self.result.finish_reason == "length" else "completed"
        return self.response(status)

    def _usage(self) -> dict[str, Any]:
        r = self.result
        return {"input_tokens": r.prompt_tokens,
                "input_tokens_details": {"cached_tokens": r.cached_tokens,
                                         "cache_write_tokens": 0},
                "output_tokens": r.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": r.prompt_tokens + r.completion_tokens}

    def keep(self, response: dict[str, Any]) -> None:
        """Kept for previous_response_id (store: true): the conversation to here."""
        if self.req.stores:
            self.request.app[RESPONSES_KEY].put(response, [
                *self.conversation.messages, *output_messages(response["output"])],
                self.previous)


def _input_param(param: str | None, first: int, sources: list[int]) -> str | None:
    """chat_media's ``messages[k]...`` as the input item it came from; ``messages`` (a
    stage's refusal of the whole prompt) as ``input``."""
    if param == "messages":
        return "input"
    found = re.match(r"messages\[(\d+)\](.*)", param or "")
    if found is None:
        return param
    k = int(found.group(1)) - first
    if k < 0:  # a message of the stored conversation
        return "previous_response_id"
    return f"input[{sources[k]}]{found.group(2)}"


class _Events:
    """The SSE stream of one response: each event numbered, typed on an ``event:`` line
    too (as OpenAI's stream; the SDK reads only ``data:``)."""

    def __init__(self, response: web.StreamResponse) -> None:
        self.response, self.sequence = response, 0

    async def send(self, *events: Event) -> None:
        """The events of one output in one socket write (a send each cost the server more
        than the rest of an event: bench/results/sse-cost-cpu.md)."""
        data = []
        for event in events:
            event = {"type": event["type"], "sequence_number": self.sequence, **event}
            self.sequence += 1
            data.append(f"event: {event['type']}\n".encode() + sse_data(event))
        if data:
            await self.response.write(b"".join(data))

    async def fail(self, run: ResponseRun, exc: Exception) -> None:
        """A failure after the 200: ``error`` with its fields flat (the OpenAI SDK yields
        them) and nested (it raises APIError, as for live OpenAI), then response.failed."""
        if not isinstance(exc, APIError | OmniError):  # a bug: the client is told to look here
            log.error("response %s failed mid-stream", run.id, exc_info=exc)
        error = run.input_error(from_exception(exc))
        code = error.code or error.type
        fields = {"code": code, "message": error.message, "param": error.param}
        await self.send({"type": "error", **fields, "error": {"type": error.type, **fields}})
        await self.send({"type": "response.failed", "response": run.response("failed", {
            "code": "server_error" if error.status >= 500 else "invalid_prompt",
            "message": error.message})})


async def _complete(run: ResponseRun) -> web.Response:
    async with contextlib.aclosing(run.call.stream(0)) as outputs:
        async for out in outputs:  # collected; read for items once, at the end
            if out.data is not None and out.modality == "text":
                run.result.add(out.data)
    run.feed_whole()
    run.finish()
    response = run.final()
    run.keep(response)
    return web.json_response(response, headers={"X-Request-Id": run.call.client_request_id})


async def _stream(run: ResponseRun) -> web.StreamResponse:
    async with contextlib.aclosing(run.call.stream(0)) as outputs:
        out = await anext(outputs, None)  # an early failure still gets its own status
        response = await start_sse(run.request, run.call.client_request_id)
        events = _Events(response)
        await events.send({"type": "response.created", "response": run.response("in_progress")},
                          {"type": "response.in_progress",
                           "response": run.response("in_progress")})
        try:
            while out is not None:
                await events.send(*run.feed(out))
                out = await next_with_pings(outputs, response)
            await events.send(*run.finish())
            final = run.final()
            await events.send({"type": f"response.{final['status']}", "response": final})
        except ConnectionError:
            raise  # the client left: leaving this block closes (aborts) the request
        except Exception as exc:
            await events.fail(run, exc)
            return response
    run.keep(final)
    return response


async def create_response(request: web.Request) -> web.StreamResponse:
    body = await read_json(request)
    req = parse(ResponseCreateRequest, body)
    run = ResponseRun(request, body, req, _previous(request.app[RESPONSES_KEY], req))
    await run.prepare()
    try:
        return await (_stream(run) if req.stream else _complete(run))
    except RejectedInputError as exc:  # a stage refused a part: named as an input item
        raise run.input_error(from_exception(exc)) from None


def _previous(store: ResponseStore, req: ResponseCreateRequest) -> Stored | None:
    """The kept response ``previous_response_id`` continues; a 400 naming it if not kept."""
    if req.previous_response_id is None:
        return None
    entry = store.get(req.previous_response_id)
    if entry is None:
        raise APIError(400, f"previous response {req.previous_response_id!r} is not kept "
                       f"here (unknown, deleted, made with store: false, or older than "
                       f"{TTL_S:g} s)", param="previous_response_id",
                       code="previous_response_not_found")
    return entry


def _kept(request: web.Request) -> str:
    response_id = request.match_info["response_id"]
    if request.app[RESPONSES_KEY].get(response_id) is None:
        raise APIError(404, f"no kept response with id {response_id!r}",
                       param="response_id", code="not_found")
    return response_id


async def get_response(request: web.Request) -> web.Response:
    return web.json_response(request.app[RESPONSES_KEY].get(_kept(request)).response)


async def delete_response(request: web.Request) -> web.Response:
    response_id = _kept(request)
    request.app[RESPONSES_KEY].delete(response_id)
    return web.json_response({"id": response_id, "object": "response.deleted",
                              "deleted": True})


def add_routes(app: web.Application) -> None:
    app[RESPONSES_KEY] = ResponseStore()
    app.router.add_post("/v1/responses", create_response)
    app.router.add_get("/v1/responses/{response_id}", get_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
