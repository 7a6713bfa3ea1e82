"""A request admitted now, its outputs read later: AsyncOmni.submit and open_stream.

`AsyncOmni.generate` is an async generator, so its request is admitted only when the
caller first reads it. A caller that reads in a task of its own (an HTTP handler that
streams n choices, or collects them in a TaskGroup) then admits it only when that task
first runs, behind everything the event loop had queued before it: with a burst of image
chats, every other handler's body read and base64 decode. The engine got the first chat
of 8 alone and the other 7 together ~20 ms later (448 px images, 2-core VM), past its
media encoder's gathering gap (omni/engines/ar/encoder.py), so their images were encoded
in a second tower call, beside the first one's decode steps. `submit` admits at once,
inside the caller's own step.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any


class Submitted:
    """A submitted request: ``async for`` reads its outputs (as `generate` yields them);
    `aclose` aborts it where it still runs, also when they were never read."""

    closing_reason = "the caller stopped reading"

    def __init__(self, omni: Any, state: Any) -> None:
        self.omni, self.state = omni, state
        self.request_id = state.request_id
        self.outputs: AsyncIterator[Any] = omni._read(state)

    @property
    def finished(self) -> bool:
        """It ended (its last output, a failure, an abort)."""
        return self.state.finished

    def __aiter__(self) -> Submitted:
        return self

    def __anext__(self) -> Awaitable[Any]:
        return self.outputs.__anext__()

    async def aclose(self) -> None:
        if not self.state.finished:
            self.omni.orchestrator.abort(self.request_id, self.closing_reason)
        await self.outputs.aclose()  # a reader that started frees what it left unread;
        self.omni._discard_unread(self.state.queue)  # this, what no reader ever took
