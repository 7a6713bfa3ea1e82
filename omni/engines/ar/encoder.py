"""Media prompts encoded off the AR engine's step loop.

Turning a request's images, video or audio into prompt embeddings runs the model's
encoder towers, which can take far longer than a decode step (a long video: many frames
through the vision tower). Done inside add(), it would stall every running request's
stream for that long. So the engine hands such prompts to one worker thread and keeps
stepping; a finished encoding joins the batch at the next step (torch releases the GIL
in its kernels, and on a GPU the two threads' work queues on the device).
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable
from typing import Any

# How long a step with nothing else to do waits for an encoding: the engine loop checks
# its socket between steps, so this bounds how late an abort or a new request is read.
IDLE_WAIT_S = 0.01


class PromptEncoder:
    """One worker thread; encodings by request id, each with the caller's context."""

    def __init__(self) -> None:
        self._pool = cf.ThreadPoolExecutor(1, thread_name_prefix="omni-encode")
        self._pending: dict[str, tuple[cf.Future, Any]] = {}

    def __bool__(self) -> bool:
        return bool(self._pending)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._pending

    def submit(self, request_id: str, context: Any, fn: Callable[..., Any], *args: Any) -> None:
        self._pending[request_id] = (self._pool.submit(fn, *args), context)

    def finished(self, wait: bool) -> list[tuple[str, Any, Any, BaseException | None]]:
        """(request id, context, result, exception) of every finished encoding; when
        `wait`, first wait up to IDLE_WAIT_S for one to finish."""
        if wait and self._pending:
            cf.wait([f for f, _ in self._pending.values()], timeout=IDLE_WAIT_S,
                    return_when=cf.FIRST_COMPLETED)
        done = []
        for rid, (future, context) in list(self._pending.items()):
            if future.done():
                del self._pending[rid]
                error = future.exception()
                done.append((rid, context, None if error else future.result(), error))
        return done

    def drop(self, request_ids: set[str]) -> None:
        """Forget these requests; an encoding already running finishes unread."""
        for rid in request_ids:
            entry = self._pending.pop(rid, None)
            if entry is not None:
                entry[0].cancel()

    def shutdown(self) -> None:
        self._pending.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)
