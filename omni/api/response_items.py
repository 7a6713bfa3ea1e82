"""The Responses API's input items as chat messages: the shape the text engines take, so
a response runs the same prompt path as /v1/chat/completions (chat template, tools in
the prompt, past calls and their results; omni/models/).

- a role message (``{"role", "content"}``, ``type`` "message" or none) keeps its role,
  but ``developer`` is ``system`` (chat templates know no developer role); a replayed
  output message is the assistant's. Text parts (``input_text``, ``output_text``,
  ``refusal``) join into one string; ``input_image`` parts become chat ``image_url``
  parts, which omni/api/chat_media.py checks against what the model takes.
- ``function_call`` items join the assistant message just before them (its text, or the
  calls before them): one assistant turn holds the text and the calls, as chat writes it.
- ``function_call_output`` is a ``tool`` message answering its ``call_id``, which must
  be a call made earlier (in this input, or the stored conversation it continues).
- ``reasoning`` items are left out (this server's models give none); ``item_reference``
  and other types are 400s naming the item.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from omni.api.errors import APIError
from omni.api.schemas import field_path, parse_at
from omni.api.schemas.responses import (
    ITEM_MODELS,
    PART_MODELS,
    FunctionCallItem,
    FunctionCallOutputItem,
    ImagePart,
    MessageItem,
    RefusalPart,
)

Loc = tuple[int | str, ...]


@dataclass
class Conversation:
    """Chat messages read from items; ``sources[k]``: the item message k came from."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)


def called_ids(messages: Iterable[dict[str, Any]]) -> set[str]:
    """The ids of the calls an earlier conversation made."""
    return {call["id"] for m in messages for call in m.get("tool_calls") or ()}


def to_messages(items: str | list[Any] | None, called: set[str]) -> Conversation:
    """A request's ``input`` as chat messages; ``called``: the ids of calls made before
    it (grows with the calls read here)."""
    out = Conversation()
    if items is None:
        return out
    if isinstance(items, str):
        out.messages.append({"role": "user", "content": items})
        out.sources.append(0)
        return out
    for i, raw in enumerate(items):
        message = _item(raw, ("input", i), called, out.messages[-1] if out.messages else None)
        if message is not None:
            out.messages.append(message)
            out.sources.append(i)
    return out


def output_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's own output items as the assistant's messages, for the kept
    conversation (not checked as input is: a call the model made up may have any name)."""
    messages: list[dict[str, Any]] = []
    for item in output:
        if item["type"] == "message":
            text = "".join(part["text"] for part in item["content"])
            messages.append({"role": "assistant", "content": text})
            continue
        call = {"id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]}}
        if messages:  # after the message (or the calls) before it, in the same turn
            messages[-1].setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    return messages


def _item(raw: Any, loc: Loc, called: set[str],
          last: dict[str, Any] | None) -> dict[str, Any] | None:
    """The message of one item; None when it joined ``last`` or is left out."""
    kind = raw.get("type", "message" if "role" in raw else None)  # role only: a message
    model = ITEM_MODELS.get(kind) if isinstance(kind, str) else None
    if model is None or kind == "item_reference":
        what = ("item_reference is not served (items are not kept by id); send the item "
                "itself, or continue a stored response with 'previous_response_id'"
                if kind == "item_reference" else
                f"input item type {kind!r} is not served; items are messages, "
                "function_call, function_call_output (and reasoning, left out)")
        raise APIError(400, f"'{field_path(loc)}': {what}", param=field_path((*loc, "type")))
    item = parse_at(model, raw, loc)
    if isinstance(item, MessageItem):
        role = "system" if item.role == "developer" else item.role
        return {"role": role, "content": _content(item.content, (*loc, "content"))}
    if isinstance(item, FunctionCallItem):
        called.add(item.call_id)
        call = {"id": item.call_id, "type": "function",
                "function": {"name": item.name, "arguments": item.arguments}}
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
            return None
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if isinstance(item, FunctionCallOutputItem):
        if item.call_id not in called:
            raise APIError(400, f"'{field_path(loc)}' answers call {item.call_id!r}, which "
                           "no earlier function_call made", param=field_path((*loc, "call_id")))
        return {"role": "tool", "tool_call_id": item.call_id,
                "content": _content(item.output, (*loc, "output"), images=False)}
    return None  # reasoning


def _content(content: str | list[dict[str, Any]], loc: Loc,
             images: bool = True) -> str | list[dict[str, Any]]:
    """A string; or, with images, chat content parts (text and image_url)."""
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for j, raw in enumerate(content):
        kind = raw.get("type")
        model = PART_MODELS.get(kind) if isinstance(kind, str) else None
        if model is None or (model is ImagePart and not images):
            taken = "input_text, output_text, refusal" + (", input_image" if images else "")
            raise APIError(400, f"'{field_path((*loc, j, 'type'))}' {kind!r} is not a content "
                           f"part taken here (taken: {taken})",
                           param=field_path((*loc, j, "type")))
        part = parse_at(model, raw, (*loc, j))
        if isinstance(part, ImagePart):
            url = {"url": part.image_url, **({"detail": part.detail} if part.detail else {})}
            parts.append({"type": "image_url", "image_url": url})
        else:
            text = part.refusal if isinstance(part, RefusalPart) else part.text
            if parts and parts[-1]["type"] == "text":
                parts[-1]["text"] += text
            else:
                parts.append({"type": "text", "text": text})
    if all(p["type"] == "text" for p in parts):  # text only: the plain string chat sends
        return "".join(p["text"] for p in parts)
    return parts
