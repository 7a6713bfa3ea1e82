"""Conversation items of a realtime session and the events that name them.

Items are what the client sees (``conversation.item.*``); the session's chat history
(omni/session/conversation.py) is rebuilt from them before each response, so deleting
or truncating an item changes what the next answer reads. A user's audio item holds no
audio here: it is transcribed when committed, and its transcript is what the model reads.
A user's ``input_image`` part (``image_url``: a data: URL, or an http(s) one the server's
--media-fetch allows) is checked when the item is created (item_events.py) and its file
kept beside the item; the model reads it as chat completions' ``image_url`` part, in the
part's place (MAX_IMAGE_BYTES of image files per conversation bound what a session holds).
A ``function_call`` item (the model's, or one the client replays) becomes an assistant
message's ``tool_calls`` and a ``function_call_output`` a ``tool`` message (protocols.md
§10.10), the history chat completions takes.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any

from omni.api.chat_media import image_part
from omni.api.realtime.config import ClientError

# GA event name -> beta event name, where they differ (protocols.md §5.3); None: GA only
BETA_NAMES: dict[str, str | None] = {
    "conversation.item.added": "conversation.item.created",
    "conversation.item.done": None,
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
}
# content part types: GA -> beta
BETA_PARTS = {"output_text": "text", "output_audio": "audio"}
MAX_ITEMS = 512
MAX_IMAGE_BYTES = 32 * 2**20  # image files one conversation holds (the items keep them)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@dataclass(eq=False)
class Item:
    id: str
    role: str
    parts: list[dict[str, Any]]  # GA content parts, without audio bytes
    status: str = "completed"
    transcribing: asyncio.Future | None = None  # an audio item's transcript, once known
    audio_ms: int = 0  # an assistant's audio: what the answer sent, or the item brought
    type: str = "message"  # or "function_call" / "function_call_output" (no parts)
    # a function_call's {"call_id", "name", "arguments"}, an output's {"call_id", "output"}
    call: dict[str, str] = field(default_factory=dict)
    images: list[bytes] = field(default_factory=list)  # the input_image parts' files, in order

    @property
    def text(self) -> str:
        return "".join(p.get("text") or p.get("transcript") or "" for p in self.parts)

    def truncate(self, index: Any, end_ms: Any) -> None:
        """Cut this assistant item's audio part ``index`` at ``end_ms`` and drop its
        transcript; ClientError (nothing changed) unless that makes sense."""
        if self.role != "assistant" or self.status == "in_progress" \
                or not any(p["type"] == "output_audio" for p in self.parts):
            raise ClientError("only a finished assistant item with audio can be truncated",
                              "invalid_value", "item_id")
        if not _is_int(index) or not 0 <= index < len(self.parts) \
                or self.parts[index]["type"] != "output_audio":
            raise ClientError(f"content_index {index!r} is not an audio part of this item",
                              "invalid_value", "content_index")
        if not _is_int(end_ms) or not 0 <= end_ms <= self.audio_ms:
            raise ClientError(f"audio_end_ms is an integer in [0, {self.audio_ms}] (the "
                              "item's audio, ms)", "invalid_value", "audio_end_ms")
        self.parts[index]["transcript"] = ""
        self.audio_ms = end_ms

    def render(self, beta: bool) -> dict[str, Any]:
        if self.type != "message":  # the same shape in GA and beta
            return {"id": self.id, "object": "realtime.item", "type": self.type,
                    "status": self.status, **self.call}
        parts = [{**p, "type": BETA_PARTS.get(p["type"], p["type"])} if beta else dict(p)
                 for p in self.parts]
        return {"id": self.id, "object": "realtime.item", "type": "message",
                "status": self.status, "role": self.role, "content": parts}


@dataclass
class Items:
    """The conversation's items in order."""

    order: list[Item] = field(default_factory=list)

    def add(self, item: Item, previous_id: str | None = None) -> str | None:
        """Insert after ``previous_id`` (None: at the end); returns the previous item's id.
        KeyError for an unknown previous id; ValueError when the conversation is full."""
        if len(self.order) >= MAX_ITEMS:
            raise ValueError(f"the conversation holds its maximum of {MAX_ITEMS} items; "
                             "delete some (conversation.item.delete)")
        index = len(self.order) if previous_id is None else self.index(previous_id) + 1
        self.order.insert(index, item)
        return self.order[index - 1].id if index else None

    def index(self, item_id: Any) -> int:
        for i, item in enumerate(self.order):
            if item.id == item_id:
                return i
        raise KeyError(item_id)

    def get(self, item_id: Any) -> Item:
        return self.order[self.index(item_id)]

    def delete(self, item_id: Any) -> None:
        del self.order[self.index(item_id)]

    @property
    def last_id(self) -> str | None:
        return self.order[-1].id if self.order else None

    def call_ids(self) -> set[str]:
        return {i.call["call_id"] for i in self.order if i.type == "function_call"}

    async def messages(self) -> list[dict[str, Any]]:
        """The chat history the model reads (waits for transcripts being made)."""
        pending = [i.transcribing for i in self.order if i.transcribing is not None]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        out: list[dict[str, Any]] = []
        for item in self.order:
            if item.type == "function_call":
                _add_call(out, item)
            elif item.type == "function_call_output":
                out.append({"role": "tool", "tool_call_id": item.call["call_id"],
                            "content": item.call["output"]})
            elif item.images:
                out.append({"role": item.role, "content": _with_images(item)})
            elif item.text:
                out.append({"role": item.role, "content": item.text})
        return out

    def image_bytes(self) -> int:
        return sum(len(image) for item in self.order for image in item.images)


def _with_images(item: Item) -> list[dict[str, Any]]:
    """A message with images as chat content parts, in the item's order (what chat
    completions' image_url parts become after the API checked them)."""
    images, parts = iter(item.images), []
    for part in item.parts:
        if part["type"] == "input_image":
            parts.append(image_part(next(images)))
        elif part.get("text") or part.get("transcript"):
            parts.append({"type": "text", "text": part.get("text") or part["transcript"]})
    return parts


def _add_call(history: list[dict[str, Any]], item: Item) -> None:
    """A call joins the assistant message just before it (the text the answer began
    with, or the calls before it: one turn of the model's); a call cut short (cancelled
    mid-arguments) was never made, so the model does not read it."""
    if item.status != "completed":
        return
    call = {"id": item.call["call_id"], "type": "function",
            "function": {"name": item.call["name"], "arguments": item.call["arguments"]}}
    last = history[-1] if history else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        history.append({"role": "assistant", "content": None, "tool_calls": [call]})


def user_item(content: Any) -> Item:
    """A conversation.item.create's item; ValueError saying what is wrong."""
    if not isinstance(content, dict):
        raise ValueError("item must be an object")
    kind = content.get("type", "message")
    if kind in ("function_call", "function_call_output"):
        return _function_item(content, kind)
    if kind != "message":
        raise ValueError("item.type is message, function_call or function_call_output")
    role = content.get("role")
    if role not in ("user", "assistant", "system"):
        raise ValueError("item.role must be user, assistant or system")
    parts = content.get("content")
    if not isinstance(parts, list) or not parts:
        raise ValueError("item.content must be a non-empty list of content parts")
    kept = []
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            if not isinstance(part.get("text"), str):
                raise ValueError(f"a {kind} part needs a 'text' string")
            kept.append({"type": "output_text" if role == "assistant" else "input_text",
                         "text": part["text"]})
        elif kind == "input_image":
            kept.append(_image_part(part, role))
        elif kind in ("input_audio", "output_audio", "audio"):
            kept.append({"type": "output_audio" if role == "assistant" else "input_audio",
                         "transcript": part.get("transcript"), "audio": part.get("audio")})
        else:
            raise ValueError(f"content part type {kind!r} is not served here")
    item_id = content.get("id") if isinstance(content.get("id"), str) else new_id("item")
    return Item(item_id, role, kept)


def _image_part(part: dict[str, Any], role: str) -> dict[str, Any]:
    if role != "user":
        raise ValueError("input_image parts belong to user messages")
    url = part.get("image_url")
    if not isinstance(url, str) or not url:
        raise ValueError("an input_image part needs an 'image_url' (a data: URL, e.g. "
                         "data:image/png;base64,...)")
    detail = part.get("detail")
    return {"type": "input_image", "image_url": url,
            **({"detail": detail} if isinstance(detail, str) else {})}


def _function_item(content: dict[str, Any], kind: str) -> Item:
    """A function_call the client replays (its own history) or the output of a call."""
    keys = ("call_id", "name", "arguments") if kind == "function_call" else (
        "call_id", "output")
    call = {k: content.get(k, "{}" if k == "arguments" else None) for k in keys}
    for key, value in call.items():
        if not isinstance(value, str) or (key in ("call_id", "name") and not value):
            raise ValueError(f"a {kind} item's '{key}' must be a string"
                             + (" (not empty)" if key in ("call_id", "name") else ""))
    item_id = content.get("id") if isinstance(content.get("id"), str) else new_id("item")
    role = "assistant" if kind == "function_call" else "tool"
    return Item(item_id, role, [], type=kind, call=call)


class EventIds:
    """``event_id`` of every server event: unique within the connection."""

    def __init__(self) -> None:
        self._count = itertools.count()
        self._prefix = uuid.uuid4().hex[:8]

    def next(self) -> str:
        return f"event_{self._prefix}{next(self._count)}"
