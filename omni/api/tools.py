"""Tool calls for the text endpoints (chat completions, Responses, realtime): what a
request's ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` mean for the engine, the
checks that make a bad one a 400 naming the field, and the calls read back out of the
answer's text (`CallStream`).

The format of the calls is the model family's (omni/models/tool_calls.py; the AR engine
says which in its READY info). ``required`` and a named function are certain: the answer
is constrained, token by token, to calls whose arguments follow each function's JSON
schema (a Lark grammar the AR sampler applies, as response_format's). ``auto`` lets the
model choose between text and calls, but a call it starts follows the schema too (the
grammar's optional form). A stage that cannot constrain decoding (vllm) serves ``auto``
unconstrained, its text read for calls, and refuses ``required``. ``none`` leaves the
tools out of the prompt.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from omni.api.errors import APIError
from omni.api.schemas.response_format import closed_objects
from omni.api.schemas.tools import AllowedToolsChoice, FunctionDef, NamedToolChoice
from omni.api.state import ServedModel
from omni.models.tool_calls import ToolCallReader, call_grammar

MAX_TOOLS_CHARS = 131_072  # of all tools' JSON text: more is a 400


@dataclass
class ToolPlan:
    """A request's tools as the engine gets them."""

    functions: list[dict[str, Any]]  # {"name", "description"?, "parameters"?}
    mode: str = "auto"  # "none" | "auto" | "required"
    parallel: bool = True
    grammar: str | None = None  # the call grammar the sampler follows
    # the functions the grammar holds calls to (named: that one), objects closed
    # (response_format.closed_objects); the prompt shows them as sent
    grammar_functions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def prompt_tools(self) -> list[dict[str, Any]] | None:
        """The tools written into the prompt (chat's shape), None for none."""
        if self.mode == "none" or not self.functions:
            return None
        return [{"type": "function", "function": f} for f in self.functions]

    @property
    def reads_calls(self) -> bool:
        return self.prompt_tools is not None

    def apply(self, inputs: dict[str, Any], sampling: dict[str, Any]) -> None:
        """Put the plan into a request's engine inputs and sampling params."""
        if self.prompt_tools is not None:
            inputs["tools"] = self.prompt_tools
        if self.grammar is not None:
            sampling["grammar"] = self.grammar


async def plan_tools(model: ServedModel, tools: Sequence[FunctionDef] | None, choice: Any,
                     parallel: bool | None, param_of: Callable[[int], str]) -> ToolPlan:
    """The plan of a request's tools; a 400 naming the field for a bad one.
    ``param_of(i)``: the path of tool i's parameters in this API's request."""
    functions = [f.model_dump(exclude_none=True, include={"name", "description",
                                                          "parameters", "strict"})
                 for f in tools or ()]
    mode, named, allowed = _choice(choice)
    if allowed is not None:
        functions = [f for f in functions if f["name"] in allowed]
    names = {f["name"] for f in functions}
    if mode in ("required", "named") and not functions:
        raise APIError(400, f"'tool_choice' {mode!r} needs 'tools' to choose from",
                       param="tool_choice")
    if named is not None and named not in names:
        raise APIError(400, f"'tool_choice' names function {named!r}, which is not in "
                       f"'tools' ({', '.join(sorted(names)) or 'none given'})",
                       param="tool_choice")
    if len(json.dumps(functions)) > MAX_TOOLS_CHARS:
        raise APIError(400, f"'tools' take more than {MAX_TOOLS_CHARS} characters of JSON",
                       param="tools")
    plan = ToolPlan(functions, "required" if mode == "named" else mode,
                    parallel is not False and named is None)
    if plan.prompt_tools is None:
        return plan
    info = _text_stage_info(model)
    if info.get("tool_format", "hermes") is None:
        raise APIError(400, f"model '{model.id}' has no tool-call format this server knows "
                       "(docs/agents.md lists the families served)", param="tools")
    await asyncio.to_thread(_check_schemas, functions, [param_of(i) for i in range(
        len(functions))])
    if not info.get("constrained_decoding"):
        if plan.mode == "required":
            raise APIError(400, f"model '{model.id}' cannot make a call certain (its stage "
                           "does not constrain decoding); use tool_choice \"auto\"",
                           param="tool_choice")
        return plan  # auto: the answer is read for calls, unconstrained
    plan.grammar_functions = [
        {**f, "parameters": closed_objects(f["parameters"])} if "parameters" in f else f
        for f in functions if named is None or f["name"] == named]
    plan.grammar = call_grammar(plan.grammar_functions, plan.parallel,
                                optional=plan.mode == "auto")
    return plan


def _choice(choice: Any) -> tuple[str, str | None, set[str] | None]:
    """(mode, named function, allowed names) of a tool_choice value."""
    if choice is None:
        return "auto", None, None
    if isinstance(choice, str):
        return choice, None, None
    if isinstance(choice, NamedToolChoice):
        if choice.function_name is None:
            raise APIError(400, "'tool_choice' of type 'function' needs the function's "
                           "'name'", param="tool_choice")
        return "named", choice.function_name, None
    if isinstance(choice, AllowedToolsChoice):
        inner = choice.allowed_tools
        mode = inner.mode if inner is not None else choice.mode
        listed = inner.tools if inner is not None else choice.tools
        names = {(t.get("function") or {}).get("name") or t.get("name") for t in listed or ()}
        return mode or "auto", None, {n for n in names if isinstance(n, str)}
    raise APIError(400, "'tool_choice' is not one this server knows", param="tool_choice")


def _text_stage_info(model: ServedModel) -> dict[str, Any]:
    """What the model's text stage said when it loaded: its ``tool_format`` (absent: the
    Hermes default all served families use) and whether it can ``constrained_decoding``
    (the AR engine); {} while no replica has reported."""
    for stage in reversed(model.omni.pipeline.route(["text"]).stages):
        info = model.omni.stage_info(stage)
        if info:
            return info
    return {}


def _check_schemas(functions: list[dict[str, Any]], params: list[str]) -> None:
    for function, param in zip(functions, params, strict=True):
        problem = schema_problem(json.dumps(function, sort_keys=True))
        if problem:
            raise APIError(400, f"'{param}' of function {function['name']!r} is not a JSON "
                           f"Schema this server can follow: {problem.strip()}", param=param)


@lru_cache(maxsize=1024)
def schema_problem(function_json: str) -> str | None:
    """What llguidance finds wrong with a function's call grammar, or None. Cached by the
    function's JSON: an agent sends the same tools with every request, and checking ten
    of them took 7.8 ms a request (dev VM)."""
    from llguidance import LLMatcher  # no torch: the front end does not import it

    grammar = call_grammar([json.loads(function_json)], parallel=False)
    try:
        return LLMatcher.validate_grammar(LLMatcher.grammar_from_lark(grammar)) or None
    except ValueError as e:
        return str(e)


def check_tool_history(messages: Sequence[Mapping[str, Any]]) -> None:
    """Every ``tool`` message answers a call an earlier assistant message made."""
    called: set[str] = set()
    for i, message in enumerate(messages):
        for call in message.get("tool_calls") or ():
            if isinstance(call, Mapping) and isinstance(call.get("id"), str):
                called.add(call["id"])
        if message.get("role") == "tool" and message.get("tool_call_id") not in called:
            raise APIError(400, f"messages[{i}] answers tool call "
                           f"{message.get('tool_call_id')!r}, which no earlier assistant "
                           "message made", param=f"messages[{i}].tool_call_id")


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class CallStream:
    """One answer's text split into content and tool calls, shaped as chat's
    ``delta.tool_calls`` (protocols.md §10.3: id, type and name in a call's first
    fragment only, argument fragments after it, one call finished before the next)."""

    reader: ToolCallReader = field(default_factory=ToolCallReader)
    ids: list[str] = field(default_factory=list)
    content: str = ""

    def feed(self, text: str) -> list[dict[str, Any]]:
        """Parts of the answer in order: {"content": str} or {"tool_call": delta}."""
        return self._shape(self.reader.feed(text))

    def finish(self) -> list[dict[str, Any]]:
        return self._shape(self.reader.finish())

    def _shape(self, events: list[Any]) -> list[dict[str, Any]]:
        parts: list[dict[str, Any]] = []
        for event in events:
            if event.index is None:
                self.content += event.content
                parts.append({"content": event.content})
            elif event.name is not None:
                self.ids.append(new_call_id())
                parts.append({"tool_call": {
                    "index": event.index, "id": self.ids[-1], "type": "function",
                    "function": {"name": event.name, "arguments": event.arguments}}})
            elif parts and parts[-1].get("tool_call", {}).get("index") == event.index:
                parts[-1]["tool_call"]["function"]["arguments"] += event.arguments
            else:
                parts.append({"tool_call": {"index": event.index,
                                            "function": {"arguments": event.arguments}}})
        return parts

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """Every call read, whole (a non-streamed message's ``tool_calls``)."""
        return [{"id": call_id, "type": "function",
                 "function": {"name": call["name"], "arguments": call["arguments"]}}
                for call_id, call in zip(self.ids, self.reader.calls, strict=True)]
