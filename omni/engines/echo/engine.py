"""The echo engine: speaks the real protocol with no model, for protocol tests and benchmarks.

Entry stages echo the client's ``prompt`` (or the last message's content); downstream
stages echo what their producers sent. Every output carries a ``trace`` of the stages
that touched it, so tests can check routing. An entry request with ``codes`` (a nested
list, rows x frames) streams them instead, split along the frames into int64 tensors,
which the engine process publishes through the connector: a codec source for testing
the data plane and generation stages. Param ``payload_bytes: N`` attaches a ``blob`` of N
bytes, all equal to the chunk index, to every output; a downstream echo stage checks
every blob it receives and fails the request if one was corrupted. Failure injection is by request params:
``echo_fail: "step"`` fails that request at this stage, ``echo_fail: "crash"`` kills
the replica process (exit code 17), both only at the stage named by ``echo_fail_stage``
(default: every stage).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omni.engines.base import (
    Engine,
    EngineError,
    EngineLoadError,
    EngineRequest,
    StepOutput,
    check_options,
)

if TYPE_CHECKING:
    from omni.engines.proc import EngineSpec


@dataclass
class _EchoJob:
    request: EngineRequest
    pieces: list[str]
    trace: list[str]
    sent: int = 0
    waiting: dict[str, int] = field(default_factory=dict)  # stream producer -> next seq
    frames: list[Any] = field(default_factory=list)  # tensors, when echoing codes

    def runnable(self) -> bool:
        return self.sent < len(self.pieces) or not self.waiting


class EchoEngine(Engine):
    """Splits each request's text into ``chunks`` pieces and emits one per step."""

    def __init__(self, stage: str, options: Mapping[str, Any] | None = None) -> None:
        options = dict(options or {})
        check_options(f"echo engine (stage '{stage}')", options, {"fail_load", "chunks", "delay_ms"})
        if "fail_load" in options:
            raise EngineLoadError(f"echo stage '{stage}': {options['fail_load']}")
        self.stage = stage
        self.chunks = int(options.get("chunks", 1))
        self.delay_s = float(options.get("delay_ms", 0)) / 1000.0
        self.jobs: dict[str, _EchoJob] = {}
        self.steps = 0

    def add(self, request: EngineRequest) -> None:
        streams = request.inputs.get("stream", [])
        inputs = {k: v for k, v in request.inputs.items() if k != "stream"}
        text, trace = _text_and_trace(inputs)
        n = max(1, int(request.params.get("chunks", self.chunks)))
        frames = _split_codes(inputs["codes"], n) if "codes" in inputs else []
        pieces = [""] * len(frames) if frames else _split(text, n)
        self.jobs[request.request_id] = _EchoJob(
            request, [] if streams and not text else pieces, trace + [self.stage],
            waiting=dict.fromkeys(streams, 0), frames=frames)

    def append(self, request_id: str, producer: str, seq: int, data: dict[str, Any] | None,
               last: bool) -> None:
        """Stream input: each chunk is echoed as one output, in order."""
        job = self.jobs.get(request_id)
        if job is None:
            return
        expected = job.waiting.get(producer)
        if expected is None or seq != expected:
            raise EngineError(f"stream from '{producer}': expected chunk {expected}, got {seq}")
        job.waiting[producer] = seq + 1
        if data is not None:
            _check_blobs([data])
            job.pieces.append(data.get("text", ""))
            upstream = [s for s in data.get("trace", []) if s not in job.trace]
            job.trace[-1:-1] = upstream  # this stage stays last
        if last:
            del job.waiting[producer]

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.jobs.pop(rid, None)

    def has_work(self) -> bool:
        return any(job.runnable() for job in self.jobs.values())

    def step(self) -> list[StepOutput]:
        self.steps += 1
        if self.delay_s:
            time.sleep(self.delay_s)  # stands in for compute time, not synchronisation
        return [self._advance(job) for job in list(self.jobs.values()) if job.runnable()]

    def _advance(self, job: _EchoJob) -> StepOutput:
        rid = job.request.request_id
        try:
            self._maybe_fail(job.request.params)
        except EngineError as exc:
            del self.jobs[rid]
            return StepOutput(rid, None, True, str(exc))
        if job.sent == len(job.pieces):  # a stream that ended after its last chunk went out
            del self.jobs[rid]
            return StepOutput(rid, None, True)
        piece = job.pieces[job.sent]
        job.sent += 1
        done = job.sent == len(job.pieces) and not job.waiting
        if done:
            del self.jobs[rid]
        data = {"text": piece, "trace": list(job.trace), "index": job.sent - 1}
        if job.frames:
            data["codes"] = job.frames[job.sent - 1]
        size = int(job.request.params.get("payload_bytes", 0))
        if size:
            data["blob"] = _blob(size, job.sent - 1)
        return StepOutput(rid, data, done)

    def _maybe_fail(self, params: Mapping[str, Any]) -> None:
        mode = params.get("echo_fail")
        if mode is None or params.get("echo_fail_stage", self.stage) != self.stage:
            return
        if mode == "crash":
            os._exit(17)  # simulates a hard crash: no cleanup, no DEAD message
        raise EngineError(f"injected failure at stage '{self.stage}'")

    def info(self) -> dict[str, Any]:
        return {"engine": "echo", "stage": self.stage, "pid": os.getpid()}

    def stats(self) -> dict[str, Any]:
        return {"running": len(self.jobs)}


def _text_and_trace(inputs: Mapping[str, Any]) -> tuple[str, list[str]]:
    """Client inputs carry prompt/messages; downstream inputs map producer -> chunks."""
    if "prompt" in inputs:
        return str(inputs["prompt"]), []
    if "prompt_token_ids" in inputs:  # no tokenizer here: the ids are echoed as text
        return " ".join(str(t) for t in inputs["prompt_token_ids"]), []
    if "messages" in inputs:
        return _last_message_text(inputs["messages"]), []
    if "codes" in inputs:
        return "", []
    text, trace = "", []
    for chunks in inputs.values():
        _check_blobs(chunks)
        text += "".join(c.get("text", "") for c in chunks)
        if chunks:
            trace += [s for s in chunks[-1].get("trace", []) if s not in trace]
    return text, trace


def _last_message_text(messages: list[Mapping[str, Any]]) -> str:
    content = messages[-1].get("content", "") if messages else ""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    return str(content)


def _blob(size: int, index: int) -> Any:
    import torch

    return torch.full((size,), index % 256, dtype=torch.uint8)


def _check_blobs(chunks: list[Any]) -> None:
    for chunk in chunks:
        blob = chunk.get("blob") if isinstance(chunk, Mapping) else None
        if blob is not None and bool((blob != chunk["index"] % 256).any()):
            raise EngineError(f"payload of chunk {chunk['index']} was corrupted in transit")


def _split_codes(codes: Any, n: int) -> list[Any]:
    import torch  # only codec-echo requests pay for it

    tensor = torch.tensor(codes, dtype=torch.int64)
    if tensor.dim() != 2:
        raise EngineError(f"codes must be rows x frames, got shape {tuple(tensor.shape)}")
    return [c.contiguous() for c in torch.tensor_split(tensor, min(n, tensor.shape[1]), dim=1)]


def _split(text: str, n: int) -> list[str]:
    size = -(-len(text) // n) if text else 0
    return [text[i * size:(i + 1) * size] for i in range(n)]


def stage_engine(spec: EngineSpec) -> EchoEngine:
    """The engine of an echo stage (omni/engines/kinds.py)."""
    return EchoEngine(spec.stage, spec.options)
