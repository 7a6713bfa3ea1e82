"""A response's ``output`` items, built from its answer as it streams, with the events
that announce them (protocols.md §10.7, §10.8). The whole answer and the streamed one
are built by the same `OutputItems`, so they cannot disagree.

The answer comes as the parts `CallStream` reads (omni/api/tools.py): content text, and
tool calls (a call's first fragment has its ``id`` and name, the next ones more
arguments). Content opens a ``message`` item (``msg_...``); a call closes the open item
and opens a ``function_call`` item (``fc_...``, its ``call_id`` the call's id). Text
after a call opens a new message. Whitespace at the end of a message's text is held
back until more text follows it: a message before a call (the model's "Let me check.\\n")
loses it, and an answer made only of calls and blank lines has no message at all. An
answer without calls always has one message, its text exactly the model's.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

Event = dict[str, Any]


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class OutputItems:
    """The output items of one answer; each method returns the events it caused (without
    ``sequence_number``: the stream numbers them)."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the last item, until it is done
        self.held = ""  # whitespace ending the text given so far, not yet in a message
        self.calls = 0

    def parts(self, parts: list[dict[str, Any]]) -> list[Event]:
        events: list[Event] = []
        for part in parts:
            if "content" in part:
                events += self._content(part["content"])
            else:
                events += self._call(part["tool_call"])
        return events

    def finish(self, finish_reason: str) -> list[Event]:
        """The last events: the open item done (``incomplete`` when the length limit cut
        it). An answer without calls or text still gets its (empty) message."""
        events: list[Event] = []
        if not self.calls:
            if self.open is None:
                events += self._open_message()
            if self.held:
                events += self._text(self.held)
        if self.open is not None:
            events += self._close("incomplete" if finish_reason == "length" else "completed")
        return events

    # ---- messages ----------------------------------------------------------------------

    def _content(self, text: str) -> list[Event]:
        events: list[Event] = []
        if self.open is not None and self.open["type"] == "function_call":
            events += self._close("completed")
        text = self.held + text
        body = text.rstrip()
        self.held = text[len(body):]
        if body:
            if self.open is None:
                events += self._open_message()
            events += self._text(body)
        return events

    def _open_message(self) -> list[Event]:
        item = {"type": "message", "id": _new_id("msg"), "status": "in_progress",
                "role": "assistant", "content": [_text_part("")]}
        self._add(item)
        at = self._at(item)
        return [{"type": "response.output_item.added", **at,
                 "item": {**item, "content": []}},
                {"type": "response.content_part.added", **at, "item_id": item["id"],
                 "content_index": 0, "part": _text_part("")}]

    def _text(self, text: str) -> list[Event]:
        self.open["content"][0]["text"] += text
        return [{"type": "response.output_text.delta", **self._at(self.open),
                 "item_id": self.open["id"], "content_index": 0, "delta": text,
                 "logprobs": []}]

    # ---- calls -------------------------------------------------------------------------

    def _call(self, fragment: dict[str, Any]) -> list[Event]:
        events: list[Event] = []
        arguments = fragment["function"].get("arguments") or ""
        if "id" in fragment:  # a new call: what was open is done
            if self.open is not None:
                events += self._close("completed")
            self.held = ""
            self.calls += 1
            item = {"type": "function_call", "id": _new_id("fc"), "call_id": fragment["id"],
                    "name": fragment["function"]["name"], "arguments": "",
                    "status": "in_progress"}
            self._add(item)
            events.append({"type": "response.output_item.added", **self._at(item),
                           "item": dict(item)})
        if arguments:
            self.open["arguments"] += arguments
            events.append({"type": "response.function_call_arguments.delta",
                           **self._at(self.open), "item_id": self.open["id"],
                           "delta": arguments})
        return events

    # ---- both --------------------------------------------------------------------------

    def _add(self, item: dict[str, Any]) -> None:
        self.items.append(item)
        self.open = item

    def _at(self, item: dict[str, Any]) -> dict[str, int]:
        assert item is self.items[-1]  # events only ever concern the last item
        return {"output_index": len(self.items) - 1}

    def _close(self, status: str) -> list[Event]:
        item, self.open = self.open, None
        item["status"] = status
        at, events = self._at(item), []
        if item["type"] == "message":
            part = item["content"][0]
            events += [{"type": "response.output_text.done", **at, "item_id": item["id"],
                        "content_index": 0, "text": part["text"], "logprobs": []},
                       {"type": "response.content_part.done", **at, "item_id": item["id"],
                        "content_index": 0, "part": copy.deepcopy(part)}]
        else:
            events.append({"type": "response.function_call_arguments.done", **at,
                           "item_id": item["id"], "name": item["name"],
                           "arguments": item["arguments"]})
        events.append({"type": "response.output_item.done", **at,
                       "item": copy.deepcopy(item)})
        return events
