"""Tool calls in a model family's own format: how tools and past calls are written into
the prompt, how the model's calls are read back out of its text, and the grammar that
makes a call certain (tool_choice "required" or a named function).

One format is served: Hermes-style, the one Qwen2/2.5/3 (and Qwen3-Omni's thinker) are
trained on and SmolLM2-Instruct's ChatML follows: each call is a JSON object on its own
between ``<tool_call>`` and ``</tool_call>``::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A template that knows tools (Qwen's) gets ``tools=`` and the history as OpenAI sends it
(its own Jinja writes the system block, the calls and the ``<tool_response>`` turns). A
ChatML template without tools (SmolLM2's, the test fixtures') gets the same text Qwen's
template would write, built here (`hermes_messages`).

Which families use which format: `tool_format` (the AR engine publishes the name; the API
reads calls with `ToolCallReader`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

HERMES = "hermes"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
# model_type values whose chat format is Qwen's ChatML with Hermes tool calls
_HERMES_FAMILIES = {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen2_5_vl", "qwen3_vl",
                    "qwen3_omni_moe", "qwen3_omni_moe_thinker", "qwen2_5_omni_thinker"}
MAX_PARALLEL_CALLS = 8  # calls one constrained answer may hold (parallel_tool_calls)
# JSON the grammar writes: one line, OpenAI's separators (as omni/engines/ar/grammar.py)
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def tool_format(model_type: str | None, chat_template: str | None) -> str | None:
    """The tool-call format of a model: Hermes for Qwen's families and any ChatML template
    (SmolLM2's); None where this server knows none (a request with tools is then a 400)."""
    if model_type in _HERMES_FAMILIES or (chat_template and "<|im_start|>" in chat_template):
        return HERMES
    return None


def template_knows_tools(chat_template: str | None) -> bool:
    return bool(chat_template) and "tools" in chat_template


# ---- the prompt -------------------------------------------------------------------------

def with_tools(messages: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
               template: str | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(messages, extra apply_chat_template kwargs) for a chat with ``tools`` (chat's
    shape) or past calls: a template that knows tools gets ``tools=`` and the calls'
    arguments as objects (templates write them with ``tojson``: Qwen2.5's whatever the
    type, Qwen3's unless a string); a ChatML one without gets Hermes text
    (`hermes_messages`). A chat without either is left as it is."""
    messages = [{**m, "tool_calls": [_decoded_arguments(c) for c in m["tool_calls"]]}
                if m.get("tool_calls") else m for m in messages]
    if not tools and not any(m.get("tool_calls") or m.get("role") == "tool"
                             for m in messages):
        return messages, {}
    if template_knows_tools(template):
        return messages, {"tools": list(tools or ()) or None}
    return hermes_messages(messages, [t["function"] for t in tools or ()]), {}


def _decoded_arguments(call: Mapping[str, Any]) -> dict[str, Any]:
    """A past call with its ``arguments`` JSON text as an object (as sent if not JSON)."""
    function = dict(call.get("function") or {})
    if isinstance(function.get("arguments"), str):
        try:
            function["arguments"] = json.loads(function["arguments"])
        except ValueError:
            pass
    return {**call, "function": function}


_SYSTEM_TOOLS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
_SYSTEM_TOOLS_END = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>")


def hermes_messages(messages: Sequence[Mapping[str, Any]],
                    tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """``messages`` (text contents) rewritten for a ChatML template without tools: the
    tool list joins the system message, an assistant's ``tool_calls`` become
    ``<tool_call>`` text, and each run of ``tool`` messages one user turn of
    ``<tool_response>`` blocks (what Qwen2.5's own template writes)."""
    out: list[dict[str, Any]] = []
    if tools:
        listing = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
        block = _SYSTEM_TOOLS + listing + _SYSTEM_TOOLS_END
        content: Any = block
        if messages and messages[0].get("role") == "system":
            own = messages[0].get("content") or ""
            content = ([*own, {"type": "text", "text": "\n\n" + block}]
                       if isinstance(own, list) else f"{own}\n\n{block}")
            messages = messages[1:]
        out.append({"role": "system", "content": content})
    for m in messages:
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            calls = "\n".join(_call_text(c) for c in m["tool_calls"])
            text = m.get("content") or ""
            out.append({"role": "assistant", "content": f"{text}\n{calls}" if text else calls})
        elif role == "tool":
            response = f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
            if out and out[-1].get("_tool_turn"):
                out[-1]["content"] += "\n" + response
            else:
                out.append({"role": "user", "content": response, "_tool_turn": True})
        else:
            out.append(dict(m))
    return [{k: v for k, v in m.items() if k != "_tool_turn"} for m in out]


def _call_text(call: Mapping[str, Any]) -> str:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass  # written as sent
    body = json.dumps({"name": function.get("name"), "arguments": arguments},
                      ensure_ascii=False)
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


# ---- the grammar of a certain call ------------------------------------------------------

def call_grammar(tools: Sequence[Mapping[str, Any]], parallel: bool,
                 optional: bool = False, answer_schema: str | None = None) -> str:
    """The grammar (llguidance's Lark, with embedded JSON schemas) of an answer made of
    tool calls, one of ``tools`` each (``{"name", "parameters"}``); up to
    MAX_PARALLEL_CALLS of them when ``parallel``. ``optional`` (tool_choice "auto"): free
    text without calls, or text up to the first ``<tool_call>`` and then the calls, so the
    model chooses, but a call it starts follows the schema. (Free text is one lexeme that
    cannot hold the tag, PRE one that ends at its first: a lexeme ends as late as it can,
    so free text that may still grow into the tag would swallow it.) ``answer_schema``
    (with ``optional``: a response_format's schema text): the answer is either a JSON value
    of that schema or calls."""
    options = [{"type": "object",
                "properties": {"name": {"const": t["name"]},
                               "arguments": t.get("parameters") or {"type": "object"}},
                "required": ["name", "arguments"], "additionalProperties": False}
               for t in tools]
    schema = {**(options[0] if len(options) == 1 else {"anyOf": options}),
              "x-guidance": _JSON_STYLE}
    more = (f' ("\\n{CALL_OPEN}\\n" body "\\n{CALL_CLOSE}"){{0,{MAX_PARALLEL_CALLS - 1}}}'
            if parallel else "")
    first = f'"\\n" body "\\n{CALL_CLOSE}"'
    if optional and answer_schema is not None:
        answer = {**json.loads(answer_schema), "x-guidance": _JSON_STYLE}
        start = (f'start: answer | "{CALL_OPEN}" {first}{more}\n'
                 f"answer: %json {json.dumps(answer)}\n")
    elif optional:
        start = (f"start: FREE | PRE {first}{more}\n"
                 f"FREE: /(.|\\n)*/ & ~/(.|\\n)*{CALL_OPEN}(.|\\n)*/\n"
                 f"PRE: /(.|\\n)*{CALL_OPEN}/ & ~/(.|\\n)*{CALL_OPEN}(.|\\n)+/\n")
    else:
        start = f'start: "{CALL_OPEN}" {first}{more}\n'
    return start + f"body: %json {json.dumps(schema)}\n"


# ---- reading calls out of the model's text ----------------------------------------------

@dataclass
class ToolCallEvent:
    """What the reader found in the latest text: ``content`` text, or a part of call
    ``index`` (``name`` set on its first part only; ``arguments`` a fragment)."""

    content: str = ""
    index: int | None = None
    name: str | None = None
    arguments: str = ""


_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


@dataclass
class _Call:
    body: str = ""  # the text after <tool_call> so far
    started: bool = False  # the name went out
    args_at: int = -1  # where the arguments value starts in body (-1: not found yet)
    sent: int = 0  # arguments characters sent
    scan: _ValueEnd = field(default_factory=lambda: _ValueEnd())


class ToolCallReader:
    """Splits a model's streamed text into content and tool calls (Hermes format).

    Text goes in as it is decoded (`feed`), events come out: content up to a possible
    ``<tool_call>``, then the call's name as soon as it is complete and its arguments as
    they grow (an object's text is streamed as written; any other value once the call
    closes). `finish` flushes what is left; `calls` holds every call read."""

    def __init__(self) -> None:
        self._pending = ""  # text not yet given out (it may be the start of a tag)
        self._call: _Call | None = None
        self.calls: list[dict[str, str]] = []  # {"name", "arguments"} of each call read

    @property
    def in_call(self) -> bool:
        """Whether a ``<tool_call>`` is open (its ``</tool_call>`` has not come yet)."""
        return self._call is not None

    def feed(self, text: str) -> list[ToolCallEvent]:
        self._pending += text
        events: list[ToolCallEvent] = []
        while True:
            before = len(self._pending), self._call is None
            events += self._step()
            if (len(self._pending), self._call is None) == before:
                return [e for e in events if e.content or e.index is not None]

    def _step(self) -> Iterator[ToolCallEvent]:
        if self._call is None:
            at = self._pending.find(CALL_OPEN)
            if at < 0:
                keep = partial_tag(self._pending, CALL_OPEN)
                yield self._content(self._pending[:len(self._pending) - keep])
                self._pending = self._pending[len(self._pending) - keep:]
                return
            yield self._content(self._pending[:at])
            self._pending = self._pending[at + len(CALL_OPEN):]
            self._call = _Call()
            return
        at = self._pending.find(CALL_CLOSE)
        take = len(self._pending) - partial_tag(self._pending, CALL_CLOSE) if at < 0 else at
        self._call.body += self._pending[:take]
        self._pending = self._pending[take:]
        yield from self._grow(self._call)
        if at >= 0:
            self._pending = self._pending[len(CALL_CLOSE):]
            yield from self._close(self._call)
            self._call = None

    def _content(self, text: str) -> ToolCallEvent:
        if self.calls or self._call is not None:
            text = text.strip()  # the newlines between calls are not an answer
        return ToolCallEvent(content=text)

    def _grow(self, call: _Call) -> Iterator[ToolCallEvent]:
        if not call.started:
            head = _HEAD.match(call.body)
            if head is None or not call.body[head.end():head.end() + 1]:
                return
            call.started, call.args_at = True, head.end()
            self.calls.append({"name": json.loads(f'"{head.group(1)}"'), "arguments": ""})
            yield ToolCallEvent(index=len(self.calls) - 1, name=self.calls[-1]["name"])
        if call.body[call.args_at] != "{":
            return  # a string or other value: given whole when the call closes
        end = call.scan.feed(call.body, call.args_at + call.sent)
        upto = len(call.body) if end is None else end
        fragment = call.body[call.args_at + call.sent:upto]
        if fragment:
            call.sent += len(fragment)
            self.calls[-1]["arguments"] += fragment
            yield ToolCallEvent(index=len(self.calls) - 1, arguments=fragment)

    def _close(self, call: _Call) -> Iterator[ToolCallEvent]:
        try:
            parsed = json.loads(call.body)
        except ValueError:
            parsed = None
        if not call.started:
            if not (isinstance(parsed, Mapping) and isinstance(parsed.get("name"), str)):
                # not a call after all: the text stays the answer's
                yield ToolCallEvent(content=f"{CALL_OPEN}{call.body}{CALL_CLOSE}")
                return
            self.calls.append({"name": parsed["name"], "arguments": ""})
            yield ToolCallEvent(index=len(self.calls) - 1, name=parsed["name"])
        if call.sent == 0 and isinstance(parsed, Mapping):
            arguments = parsed.get("arguments", {})
            if isinstance(arguments, str):
                text = arguments  # some models write the arguments as a JSON string
            else:
                text = json.dumps(arguments, ensure_ascii=False)
            self.calls[-1]["arguments"] = text
            yield ToolCallEvent(index=len(self.calls) - 1, arguments=text)

    def finish(self) -> list[ToolCallEvent]:
        """The end of the text: a tag's start held back is content after all; an
        unclosed call keeps what was read of it (the answer was cut: finish "length")."""
        events = []
        if self._call is None:
            events.append(self._content(self._pending))
        elif not self._call.started:
            events.append(ToolCallEvent(content=CALL_OPEN + self._call.body + self._pending))
        self._pending, self._call = "", None
        return [e for e in events if e.content]


def spoken_text(text: str, final: bool) -> tuple[str, str]:
    """(what a voice may read of streamed ``text``, what to hold until more comes): the
    calls are left out, since a call is for the client, not the listener; an open call,
    or a tag's start at the end, is held back until it closes. At the end of the stream
    (``final``) an open call is dropped, and a tag's start that never became one is read."""
    spoken, rest = "", text
    while (at := rest.find(CALL_OPEN)) >= 0:
        end = rest.find(CALL_CLOSE, at)
        spoken += rest[:at]
        if end < 0:
            return spoken, "" if final else rest[at:]
        spoken, rest = spoken + " ", rest[end + len(CALL_CLOSE):]  # words stay apart
    keep = 0 if final else partial_tag(rest, CALL_OPEN)
    return spoken + rest[:len(rest) - keep], rest[len(rest) - keep:]


def partial_tag(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` could begin ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class _ValueEnd:
    """Finds where a JSON object's text ends, fed as it grows (strings and escapes
    followed), so the arguments can go out before the call closes."""

    def __init__(self) -> None:
        self.depth, self.in_string, self.escaped, self.pos = 0, False, False, -1
        self.end: int | None = None

    def feed(self, text: str, start: int) -> int | None:
        """The index just past the object's closing brace, or None if it is still open."""
        if self.end is not None:
            return self.end
        i = max(start, self.pos + 1)
        while i < len(text):
            ch = text[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.end = i + 1
                    return self.end
            self.pos = i
            i += 1
        return None
