"""The function calls of one realtime response, read out of its text as it streams
(omni/api/tools.py CallStream) and sent as realtime events (protocols.md §10.10).

Each call is its own output item: ``response.output_item.added`` and
``conversation.item.added`` as soon as its name is known (arguments ""), then
``response.function_call_arguments.delta`` per fragment, and when the call's text closes
``.done`` (call_id, name, arguments), ``response.output_item.done`` and
``conversation.item.done``. A call still open when the answer ends (cut by
max_output_tokens, or cancelled) is finished ``incomplete``; the next answer does not
read it (items.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from omni.api.realtime.items import Item, new_id
from omni.api.tools import CallStream

Send = Callable[[dict[str, Any]], Awaitable[None]]
# adds an item to the response's output and the conversation; returns its output_index
AddOutput = Callable[[Item], Awaitable[int]]


class CallItems:
    """Splits a response's text into content (handed back) and function_call items."""

    def __init__(self, response_id: str, send: Send, add_output: AddOutput) -> None:
        self.response_id, self.send, self.add_output = response_id, send, add_output
        self.stream = CallStream()
        self.item: Item | None = None  # the call being read
        self.index = -1  # its output_index

    async def feed(self, text: str) -> str:
        """The content of ``text``; its call parts go out as events."""
        return await self._parts(self.stream.feed(text))

    async def finish(self, status: str = "completed") -> str:
        """The end of the answer: a call still open is incomplete (cut, or cancelled);
        the content held back (a tag's start that was not one) is returned."""
        if self.stream.reader.in_call or status != "completed":
            await self._done("incomplete")
        return await self._parts(self.stream.finish())

    async def _parts(self, parts: list[dict[str, Any]]) -> str:
        content = ""
        for part in parts:
            if "content" in part:
                content += part["content"]
                continue
            call = part["tool_call"]
            if "id" in call:  # a new call: the one before it is closed
                await self._done("completed")
                await self._open(call["id"], call["function"]["name"])
            await self._arguments(call["function"]["arguments"])
        if self.item is not None and not self.stream.reader.in_call:
            await self._done("completed")  # its </tool_call> came: no need to wait
        return content

    def _ids(self) -> dict[str, Any]:
        assert self.item is not None
        return {"response_id": self.response_id, "item_id": self.item.id,
                "output_index": self.index, "call_id": self.item.call["call_id"]}

    async def _open(self, call_id: str, name: str) -> None:
        self.item = Item(new_id("item"), "assistant", [], "in_progress", type="function_call",
                         call={"call_id": call_id, "name": name, "arguments": ""})
        self.index = await self.add_output(self.item)

    async def _arguments(self, fragment: str) -> None:
        if self.item is None or not fragment:
            return
        self.item.call["arguments"] += fragment
        await self.send({"type": "response.function_call_arguments.delta", **self._ids(),
                         "delta": fragment})

    async def _done(self, status: str) -> None:
        item = self.item
        if item is None:
            return
        await self.send({"type": "response.function_call_arguments.done", **self._ids(),
                         "name": item.call["name"], "arguments": item.call["arguments"]})
        item.status = status
        await self.send({"type": "response.output_item.done", "response_id": self.response_id,
                         "output_index": self.index, "item": item})
        await self.send({"type": "conversation.item.done", "item": item})
        self.item = None
