"""The SSE answer of /v1/completions and chat completions' text (omni/api/text.py):
every choice's outputs merged into one stream of chunks, written in as few socket writes
as the server's lag allows."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import web

from omni.api.errors import sse_error_event
from omni.api.streams import SSE_PING_EVERY_S, sse_data, start_sse
from omni.api.text_result import usage

# ``call`` below is text.py's TextCall (not imported: text.py imports this module)

MAX_UNSENT_EVENTS = 64  # at most this many events wait for one write


class Merged:
    """The outputs of all choices as one queue of (index, output | exception | None)."""

    def __init__(self, streams: list[Any]) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.streams = streams
        self.tasks = [asyncio.ensure_future(self._pump(s, i)) for i, s in enumerate(streams)]

    async def _pump(self, stream: Any, index: int) -> None:
        try:
            async with contextlib.aclosing(stream) as outputs:
                async for out in outputs:
                    await self.queue.put((index, out))
            await self.queue.put((index, None))
        except Exception as exc:
            await self.queue.put((index, exc))

    def ready(self) -> bool:
        """Whether the next item is already queued (next() returns it without waiting)."""
        return not self.queue.empty()

    async def next(self, response: web.StreamResponse | None) -> tuple[int, Any]:
        # a queued item is taken at once, else asyncio.timeout: wait_for wrapped each get
        # in a task of its own, ~10 % of the server's time per streamed token (py-spy,
        # bench/probes/sse_cost.py)
        if self.ready():
            return self.queue.get_nowait()
        while True:
            try:
                async with asyncio.timeout(SSE_PING_EVERY_S):
                    return await self.queue.get()
            except TimeoutError:
                if response is not None:
                    await response.write(b": ping\n\n")  # keeps proxies from timing out

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()  # leaving a stream early aborts that choice in every stage
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await close_all(self.streams)  # also those whose task never ran


async def close_all(streams: list[Any]) -> None:
    """Close every choice (a closed or finished one is left as it is)."""
    for stream in streams:
        await stream.aclose()


async def stream_answer(call: Any) -> web.StreamResponse:
    chunk_object = "chat.completion.chunk" if call.chat else "text_completion"
    include_usage = call.req.include_usage
    merged = Merged(await call.submit_all())
    try:
        index, item = await merged.next(None)  # an early error becomes a proper status
        if isinstance(item, Exception):
            raise item
        response = await start_sse(call.request, call.client_request_id)
        await _stream_body(call, merged, response, (index, item), chunk_object, include_usage)
    finally:
        await merged.close()
    return response


async def _stream_body(call: Any, merged: Merged, response: web.StreamResponse,
                       first: tuple[int, Any], chunk_object: str, include_usage: bool) -> None:
    # The events of outputs already queued go out in one socket write: one send() a token
    # was ~30 % of the server's time at 32 streams (py-spy, bench/probes/sse_cost.py). A
    # server keeping up writes each event at once (the queue is empty after it); one that
    # falls behind writes fewer, larger chunks instead of falling further behind.
    unsent: list[bytes] = []

    def send(payload: dict[str, Any]) -> None:  # queued: flush() writes
        if include_usage:  # OpenAI: every chunk carries usage, null until the last one
            payload.setdefault("usage", None)
        unsent.append(sse_data(payload))

    async def flush() -> None:
        if unsent:
            data = b"".join(unsent)
            unsent.clear()
            await response.write(data)

    results = [call.new_result() for _ in range(call.n)]
    open_choices, pending = set(range(call.n)), first
    try:
        for i in range(call.n):
            send(call.envelope(chunk_object, [call.delta_choice(i, None, None, True)]))
        while open_choices:
            if pending is None and (not merged.ready() or len(unsent) >= MAX_UNSENT_EVENTS):
                await flush()
            index, item = pending if pending is not None else await merged.next(response)
            pending = None
            if isinstance(item, Exception):
                raise item
            if item is None:
                open_choices.discard(index)
                if results[index].calls is not None:
                    _send_parts(call, index, results[index].calls.finish(), send)
                send(call.envelope(chunk_object, [call.delta_choice(
                    index, None, results[index].reason, False)]))
            elif item.data is not None and item.modality == "text":
                offset = len(results[index].text)
                delta = results[index].add(item.data)
                entries = item.data.get("logprobs")
                if results[index].calls is not None:
                    _send_parts(call, index, results[index].calls.feed(delta), send)
                elif delta or entries:
                    send(call.envelope(chunk_object, [call.delta_choice(
                        index, delta, None, False, entries, offset)]))
        if include_usage:
            send({**call.envelope(chunk_object, []), "usage": usage(results)})
        unsent.append(b"data: [DONE]\n\n")
        await flush()
    except (ConnectionResetError, ConnectionError):
        raise  # the client left; closing the merge aborts every choice
    except Exception as exc:
        unsent.append(sse_error_event(exc))  # after the events it followed
        await flush()


def _send_parts(call: Any, index: int, parts: list[dict[str, Any]],
                      send: Any) -> None:
    """A tool-reading answer's content and call fragments, each as a chunk (logprobs
    are not given beside tool calls)."""
    for part in parts:
        if "content" in part:
            choice = call.delta_choice(index, part["content"], None, False)
        else:
            choice = call.tool_call_choice(index, part["tool_call"])
        send(call.envelope("chat.completion.chunk", [choice]))
