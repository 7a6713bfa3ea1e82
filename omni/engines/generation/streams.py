"""Streaming engine: runners that keep per-request recurrent state (voice activity).

The generation engine cuts inputs into chunks and batches them across requests, each
chunk a pure function of its frames and context. Some models instead carry state from
one piece of input to the next and answer with sparse events (a VAD: "speech started"
after a while of audio, nothing most of the time); for them this engine holds one runner
state per request and feeds it each piece in arrival order.

Runner (``streams = True``): ``open_stream(params) -> state`` (ValueError: bad params),
``feed(state, data) -> [event, ...]`` (ValueError / TypeError: bad input),
``close_stream(state) -> [event, ...]`` (the end of the input; may be []), ``info()``,
``input_key`` (the data key that holds the input, e.g. "audio"), ``OPTIONS``; optional
``progress(state) -> dict`` (e.g. {"audio_ms": ...}), added to every output.

Inputs (add): {"stream": [producer, ...]} (pieces come through append, numbered per
producer; ``last`` from every producer ends the input), beside which an ``input_key``
value is fed first; without "stream", {input_key: ..., ...} is the whole input (one
piece), or {producer: [piece, ...]} from a full-delivery edge.

Outputs: one per step for a request whose pieces made events: {"events": [...],
**progress}; after the end of its input, a finished one with close_stream's events.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omni.engines.base import (
    Engine,
    EngineError,
    EngineRequest,
    StepOutput,
    check_options,
    failed_output,
)


@dataclass(eq=False)
class _Stream:
    state: Any  # the runner's
    open: dict[str, int]  # stream producer -> the seq expected next
    queued: deque = field(default_factory=deque)  # pieces not fed yet, in arrival order
    ended: bool = False  # all of its input has arrived


class StreamingEngine(Engine):
    """One runner state per request, fed in arrival order (see the module docstring)."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self._streams: dict[str, _Stream] = {}
        self._failed: list[StepOutput] = []

    # -- contract ---------------------------------------------------------------------
    def add(self, request: EngineRequest) -> None:
        rid = request.request_id
        try:
            if rid in self._streams:
                raise ValueError(f"request id {rid!r} is already running")
            self._streams[rid] = self._open(request.inputs or {}, dict(request.params or {}))
        except Exception as exc:  # bad inputs or params: this request fails, alone
            self._failed.append(failed_output(rid, exc))

    def _open(self, inputs: Mapping[str, Any], params: dict[str, Any]) -> _Stream:
        key = self.runner.input_key
        producers = inputs.get("stream")
        if producers is not None and (not isinstance(producers, list) or not producers
                                      or not all(isinstance(p, str) for p in producers)):
            raise ValueError(f"'stream' must list producer names, got {producers!r}")
        rest = {k: v for k, v in inputs.items() if k != "stream"}
        if key in rest:  # the whole input, or its start
            pieces: list[Any] = [rest]
        elif all(isinstance(v, list) for v in rest.values()) and (rest or producers):
            pieces = [c for chunks in rest.values() for c in chunks]  # full delivery
        else:
            raise ValueError(f"inputs need '{key}', 'stream' or producer chunks, got "
                             f"{sorted(inputs)}")
        stream = _Stream(self.runner.open_stream(params), {p: 0 for p in producers or ()})
        stream.queued.extend(pieces)
        stream.ended = not stream.open
        return stream

    def append(self, request_id: str, producer: str, seq: int, data: dict[str, Any] | None,
               last: bool) -> None:
        stream = self._streams.get(request_id)
        if stream is None:
            return  # aborted or failed: pieces still in flight are dropped
        want = stream.open.get(producer)
        if want is None or seq != want:
            del self._streams[request_id]  # it has failed: the caller reports why
            if want is None:
                raise EngineError(f"unexpected stream input from '{producer}' (expected "
                                  f"{sorted(stream.open) or 'none'})")
            kind = "duplicate" if isinstance(seq, int) and seq < want else "out-of-order"
            raise EngineError(f"{kind} chunk from '{producer}': seq {seq}, expected {want}")
        if isinstance(data, Mapping) and last and self.runner.input_key not in data:
            data = None  # a closing message with nothing to feed
        if data is None and not last:
            self._fail(request_id, ValueError(f"stream chunk {seq} from '{producer}' has no "
                                              "data and is not the last"))
            return
        if data is not None:
            stream.queued.append(data)
        stream.open[producer] = want + 1
        if last:
            del stream.open[producer]
            stream.ended = not stream.open

    def abort(self, request_ids: list[str]) -> None:
        ids = set(request_ids)
        for rid in ids:
            self._streams.pop(rid, None)
        self._failed = [o for o in self._failed if o.request_id not in ids]

    def has_work(self) -> bool:
        return bool(self._failed) or any(s.queued or s.ended for s in self._streams.values())

    def step(self) -> list[StepOutput]:
        outputs, self._failed = self._failed, []
        progress = getattr(self.runner, "progress", None)
        for rid, stream in list(self._streams.items()):
            if not (stream.queued or stream.ended):
                continue
            events: list[dict[str, Any]] = []
            try:
                while stream.queued:
                    events += self.runner.feed(stream.state, stream.queued.popleft())
                if stream.ended:
                    events += self.runner.close_stream(stream.state)
                data = {"events": events, **(progress(stream.state) if progress else {})}
            except Exception as exc:  # bad input (or a model error) fails this request only
                del self._streams[rid]
                outputs.append(failed_output(rid, exc))
                continue
            if stream.ended:
                del self._streams[rid]
                outputs.append(StepOutput(rid, data=data, finished=True))
            elif events:
                outputs.append(StepOutput(rid, data=data))
        return outputs

    def info(self) -> dict[str, Any]:
        return {"engine": "generation", "streams": True, **self.runner.info()}

    def stats(self) -> dict[str, Any]:
        return {"streams": len(self._streams)}

    def shutdown(self) -> None:
        self._streams.clear()
        self._failed.clear()

    def _fail(self, rid: str, exc: Exception) -> None:
        self._streams.pop(rid, None)
        self._failed.append(failed_output(rid, exc))


def build_streaming_engine(model: str, *, model_dir: str | None, device: str, dtype: str,
                           options: Mapping[str, Any]) -> StreamingEngine:
    """The engine of a streaming runner: it batches nothing, so it reads only the
    adapter's options (the generation engine's batch and chunk sizes are refused)."""
    from omni.models import adapter_options, build_runner

    check_options(f"generation engine ({model}, streaming)", options, adapter_options(model))
    return StreamingEngine(build_runner(model, model_dir=model_dir, device=device, dtype=dtype,
                                        options=options))
