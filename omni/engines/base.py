"""The Engine contract: what every engine kind implements, with no sockets.

`engines/proc.py` wraps any Engine in a process (one control connection, one thread);
tests drive the same object in-process. An engine is single-threaded: the process
loop calls add/abort/step from one thread only.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


class EngineError(Exception):
    """A request-level failure the engine reports for one request (others keep running)."""


class EngineLoadError(Exception):
    """The engine cannot start (bad model directory, bad options); fails the launch."""


# stage options read for the engine's process, whatever the engine: its CPU priority
# (proc.py) and its payload arena (launcher.py)
PROCESS_OPTIONS = frozenset({"nice", "payload_arena_mb", "inbound_drainer", "gc_freeze"})


def check_options(kind: str, options: Mapping[str, Any] | None, known: Iterable[str]) -> None:
    """A stage's ``options`` must all be read by its engine (or its process): a typo is a
    load error that names the valid ones, never a setting silently ignored."""
    valid = frozenset(known) | PROCESS_OPTIONS
    unknown = sorted(set(options or {}) - valid)
    if unknown:
        raise EngineLoadError(f"unknown {kind} option(s) {', '.join(unknown)}; the options "
                              f"are {', '.join(sorted(valid))}")


@dataclass
class EngineRequest:
    """One request as an engine sees it.

    inputs: for an entry stage, the client's inputs (e.g. {"prompt": "..."}); for a
        downstream stage, {producer_stage_name: [chunk, ...]} of every upstream stage on
        the request's route (full delivery: all chunks of a finished producer).
    params: the stage's default params merged with the request's per-stage params.
    """

    request_id: str
    inputs: dict[str, Any]
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepOutput:
    """One request's new output from one engine step.

    data: a small msgpack-able dict (str/bytes/numbers/lists/dicts); heavy tensors go
        through a connector and ride here as PayloadRefs (Runtime core II).
    finished: the request is done at this stage (no more outputs will come).
    error: set when the request failed at this stage; implies finished.
    error_kind: whose fault the error is: ENGINE_FAULT (the API answers 500) or
        INPUT_FAULT (the request's input, which the client must fix: a 400).
    """

    request_id: str
    data: dict[str, Any] | None = None
    finished: bool = False
    error: str | None = None
    error_kind: str = "engine"


ENGINE_FAULT, INPUT_FAULT = "engine", "input"


def failed_output(request_id: str, exc: Exception) -> StepOutput:
    """The output of a request the engine could not take: a ValueError / TypeError while
    reading its inputs is the input's fault; any other exception is the engine's."""
    kind = INPUT_FAULT if isinstance(exc, ValueError | TypeError) else ENGINE_FAULT
    return StepOutput(request_id, finished=True, error=f"{type(exc).__name__}: {exc}",
                      error_kind=kind)


class Engine(abc.ABC):
    """Continuous-batching compute for one stage replica."""

    @abc.abstractmethod
    def add(self, request: EngineRequest) -> None:
        """Admit a request; it joins the batch at the next step."""

    def append(self, request_id: str, producer: str, seq: int, data: dict[str, Any] | None,
               last: bool) -> None:
        """More input for a request fed by a ``stream`` edge from stage ``producer``.

        ``seq`` counts 0, 1, 2, ... per (request, producer); ``last`` marks the end of
        that producer's stream (``data`` may then be None). A request whose every stream
        producer has sent ``last`` has all of its input. An unknown ``request_id`` (one
        already aborted) is ignored; a gap or repeat in ``seq`` raises EngineError.
        Engines that take no stream input keep this default, which refuses it.
        """
        raise EngineError(f"this engine takes no stream input (from '{producer}')")

    def limit(self, limits: Mapping[str, int | None]) -> None:
        """Flow control from a ``stream`` edge with ``max_lead`` (omni/lead.py): request id
        -> the most outputs (tokens) it may have made so far, None lifting the limit. A
        request at its limit makes no more until raised; unknown ids are ignored. Advisory:
        an engine that cannot hold a request keeps this default and runs on."""
        return None

    @abc.abstractmethod
    def abort(self, request_ids: list[str]) -> None:
        """Drop requests now and free what they hold; unknown ids are ignored."""

    @abc.abstractmethod
    def has_work(self) -> bool:
        """True while any admitted request still needs a step."""

    @abc.abstractmethod
    def step(self) -> list[StepOutput]:
        """Advance every runnable request once; return their new outputs."""

    def info(self) -> dict[str, Any]:
        """Capabilities and memory, sent to the orchestrator in READY."""
        return {}

    def stats(self) -> dict[str, Any]:
        """Queue length and state bytes, for /metrics and load balancing."""
        return {}

    def shutdown(self) -> None:
        """Release everything the engine holds. Called once, at exit."""
        return None
