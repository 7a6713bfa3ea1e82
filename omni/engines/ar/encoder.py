"""Media prompts encoded off the AR engine's step loop, batched across requests.

Turning a request's images, video or audio into prompt embeddings runs the model's
encoder towers, which can take far longer than a decode step (a long video: many frames
through the vision tower). Done inside add(), it would stall every running request's
stream for that long. So the engine hands such prompts to one worker thread and keeps
stepping; a finished encoding joins the batch at the next step (torch releases the GIL
in its kernels, and on a GPU the two threads' work queues on the device).

Batching: prompts wait in a queue while the worker is busy; when it is free, every
waiting prompt goes to it in one call of the engine's batch function (a model whose media
encoder batches, e.g. one vision-tower call for the images of all of them). So under load
the tower runs on batches the size of what arrived during the previous encoding, as
continuous batching does for decode steps.

Gathering (omni/engines/gather/): a prompt that finds the worker idle waits until no
other has arrived for ``gather_s``, so a burst that reaches the engine spread out is
encoded in one batch (started on the first arrival, the worker ran a batch of 1; the
other 7 waited for it, then encoded beside the first request's decode steps, whose thread
holds the same GIL: in-process on the CPU, adding the 7 only 2 ms after the first doubled
their TTFT). Prompts that queued while the worker was busy have already waited: they go
as soon as it is free. A caller with nothing else to run (``finished(wait=True)``)
starts a gathering batch at once: the engine process's loop only steps once the gathering
is over (AREngine.gather_s), and a direct caller has nothing more to add meanwhile.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Callable
from typing import Any

from omni.engines.gather import Gathering

# How long a step with nothing else to do waits for an encoding: the engine loop checks
# its socket between steps, so this bounds how late an abort or a new request is read.
IDLE_WAIT_S = 0.01

# Option encode_gather_ms's default: the gap that ends a gathering batch. On a 2-core VM
# (bench vlm's tiny image-chat fixture, 112 px images, 8 chats at once through HTTP) 5 ms
# took TTFT p50 from 72-80 ms to 47-48 and cost a lone request 1.5-4 ms; 10 ms gained no
# more. With 448 px images the front end's serial work bounds it: no clear change.
GATHER_MS = 5.0

KEPT_BATCHES = 256  # recent batch sizes kept (a long-running server's list stays bounded)

# batch function: inputs of several requests -> per request its result or the exception
# it raised (one bad request fails alone)
BatchFn = Callable[[list[Any]], list[Any]]


class PromptEncoder:
    """One worker thread; queued encodings by request id, each with the caller's context."""

    def __init__(self, batch_fn: BatchFn, gather_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._batch_fn = batch_fn
        self._gathering = Gathering(gather_s, clock)  # of prompts that found the worker idle
        self._pool = cf.ThreadPoolExecutor(1, thread_name_prefix="omni-encode")
        self._queued: dict[str, tuple[Any, Any]] = {}  # rid -> (inputs, context)
        self._running: list[tuple[str, Any]] = []  # (rid, context) of the worker's batch
        self._dropped: set[str] = set()  # of the running batch: results left unread
        self._future: cf.Future | None = None
        self.batches: list[int] = []  # sizes of the latest batches run (tests), bounded
        # since start (engine stats): batches run, prompts in them, the worker's seconds
        self.batch_count, self.prompt_count, self.busy_s = 0, 0, 0.0

    def __bool__(self) -> bool:
        return bool(self._queued or self._running)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._queued or (
            request_id not in self._dropped and any(r == request_id for r, _ in self._running))

    def submit(self, request_id: str, context: Any, inputs: Any) -> None:
        self._gathering.arrived(opens=self._future is None and not self._queued)
        self._queued[request_id] = (inputs, context)

    def wait_s(self) -> float:
        """How long the queued prompts still gather before their batch may start (0: it
        may start now, or nothing gathers)."""
        return self._gathering.left_s()

    def finished(self, wait: bool) -> list[tuple[str, Any, Any, BaseException | None]]:
        """(request id, context, result, exception) of every finished encoding; starts
        the queued ones when the worker is free; when `wait` (the caller has nothing else
        to run), a gathering batch starts now and this first waits up to IDLE_WAIT_S for
        the running batch. A loop that reads arrivals waits out `wait_s` before that."""
        self._start(force=wait)
        if self._future is None:
            return []
        if wait and not self._future.done():
            cf.wait([self._future], timeout=IDLE_WAIT_S)
        if not self._future.done():
            return []
        done = self._collect(self._future)
        self._start()  # what queued meanwhile goes at once
        return done

    def _start(self, force: bool = False) -> None:
        if self._future is not None or not self._queued or (self.wait_s() > 0 and not force):
            return
        self._gathering.end()
        batch, self._queued = self._queued, {}
        self._running = [(rid, context) for rid, (_, context) in batch.items()]
        self.batches.append(len(batch))
        del self.batches[:-KEPT_BATCHES]
        self.batch_count += 1
        self.prompt_count += len(batch)
        self._future = self._pool.submit(self._timed, [inputs for inputs, _ in batch.values()])

    def _timed(self, batch: list[Any]) -> list[Any]:
        """The batch function on the worker, its time added to busy_s."""
        begun = time.perf_counter()
        try:
            return self._batch_fn(batch)
        finally:
            self.busy_s += time.perf_counter() - begun

    def _collect(self, future: cf.Future) -> list[tuple[str, Any, Any, BaseException | None]]:
        running, dropped = self._running, self._dropped
        self._running, self._dropped, self._future = [], set(), None
        error = future.exception()
        results = [error] * len(running) if error else future.result()
        done = []
        for (rid, context), result in zip(running, results, strict=True):
            if rid not in dropped:
                failed = result if isinstance(result, BaseException) else None
                done.append((rid, context, None if failed else result, failed))
        return done

    def drop(self, request_ids: set[str]) -> None:
        """Forget these requests; a batch already running finishes, their results unread."""
        for rid in request_ids:
            self._queued.pop(rid, None)
        if not self._queued:
            self._gathering.end()
        self._dropped |= request_ids & {rid for rid, _ in self._running}

    def shutdown(self) -> None:
        self._queued.clear()
        self._running.clear()
        self._gathering.end()
        self._pool.shutdown(wait=False, cancel_futures=True)
