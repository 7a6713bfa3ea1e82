"""What the generation engine (engine.py) takes in: a request's inputs, complete, from
producer chunks or as a stream, turned into its frames (the runner parses them) or, in
items mode, its units (the runner splits them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from omni.engines.generation.request import GenRequest, Runner


class RequestIntake:
    """The engine's input side (a collaborator of GenerationEngine): builds requests and
    adds input values to them. ValueError / TypeError: the request's own input is bad."""

    def __init__(self, runner: Runner, items: bool) -> None:
        self.runner = runner
        self.items = items

    @property
    def buffers_text(self) -> bool:
        """Items mode with a runner that cuts streamed text at sentence ends itself."""
        return self.items and getattr(self.runner, "split_stream", None) is not None

    def new_request(self, rid: str, inputs: Mapping[str, Any],
                    params: dict[str, Any]) -> GenRequest:
        key = self.runner.input_key
        for name in getattr(self.runner, "side_inputs", ()):  # e.g. a TTS reference clip
            if name in inputs:
                params[name] = inputs[name]
        req = GenRequest(rid, params=params)
        if key in inputs:
            self.take(req, inputs[key], context=inputs.get("context"))
            req.complete = True
        elif "stream" in inputs:
            producers = inputs["stream"]
            if (not isinstance(producers, list) or len(producers) != 1
                    or not isinstance(producers[0], str)):
                raise ValueError(f"'stream' must name exactly one producer stage, got {producers!r}")
            req.stream = True
            req.open = {producers[0]: 0}
        elif inputs and all(isinstance(v, list) for v in inputs.values()):
            self._take_chunks(req, inputs)
            req.complete = True
        else:
            raise ValueError(f"inputs need '{key}', 'stream' or producer chunks, got {sorted(inputs)}")
        return req

    def _take_chunks(self, req: GenRequest, inputs: Mapping[str, Any]) -> None:
        """A full-delivery edge's input: {producer: [chunk, ...]}."""
        key = self.runner.input_key
        if len(inputs) != 1:
            raise ValueError(f"expected input from one producer, got {sorted(inputs)}")
        (producer, chunks), = inputs.items()
        if chunks and isinstance(chunks[-1], Mapping) and key not in chunks[-1]:
            chunks = chunks[:-1]  # its closing output (e.g. its end token), as in take_chunk()
        for i, chunk in enumerate(chunks):
            if not isinstance(chunk, Mapping) or key not in chunk:
                raise ValueError(f"chunk {i} from '{producer}' has no '{key}'")
        values = [chunk[key] for chunk in chunks]
        contexts = [chunk.get("context") for chunk in chunks]
        # one parse for the whole input where the runner can join it: a producer that
        # streams a frame per step hands over hundreds of chunks, and parsing each
        # held 32 complete answers' ADDs 10 ms apiece (bench omni, full c=32)
        joinable = not self.items and all(c is None for c in contexts)
        joined = getattr(self.runner, "join", lambda v: None)(values) if joinable else None
        for value, context in (zip(values, contexts, strict=True) if joined is None
                               else [(joined, None)]):
            self.take(req, value, context=context)

    def take_chunk(self, req: GenRequest, data: Any, last: bool) -> None:
        """One stream chunk's data (an APPEND's, its order already checked)."""
        key = self.runner.input_key
        if isinstance(data, Mapping) and last and key not in data:
            data = None  # the producer's closing output (e.g. its end token): no frames
        if data is not None:
            if not isinstance(data, Mapping) or key not in data:
                raise ValueError(f"stream chunk needs '{key}'")
            taken = self.take(req, data[key], final=last, context=data.get("context"))
            if taken < 1 and not last and not self.buffers_text:
                raise ValueError("a stream chunk must carry at least one frame")
        elif not last:
            raise ValueError("a stream chunk without data must be the last one")
        elif self.buffers_text:
            self.take(req, "", final=True)  # the text held back for a sentence end

    def take(self, req: GenRequest, value: Any, final: bool = True, context: Any = None) -> int:
        """Add one input value to the request; returns how many frames (or units) it held.
        A streamed text value may be held back until its sentence ends (``final``: the
        stream ended, flush it). ``context``: frames decoded as left context before the
        value's, with no output (GenRequest.contexts)."""
        if self.items:
            if req.stream and self.buffers_text:
                if not isinstance(value, str):
                    raise ValueError(f"'{self.runner.input_key}' must be a string")
                units, req.held = self.runner.split_stream(req.held + value, req.params, final)
            else:
                units = self.runner.split(value, req.params)
            req.units += units
            req.total += len(units)
            return len(units)
        if context is not None:
            start = req.total
            _push(req, self.runner.parse(context))
            if req.total > start:
                req.contexts.append((start, req.total))
        piece = self.runner.parse(value)
        _push(req, piece)
        return piece.shape[-1]


def _push(req: GenRequest, piece: torch.Tensor) -> None:
    if req.pieces and piece.shape[:-1] != req.pieces[0].shape[:-1]:
        raise ValueError(f"chunk shape {tuple(piece.shape)} does not match "
                         f"{tuple(req.pieces[0].shape)}")
    if piece.shape[-1]:
        req.pieces.append(piece)
        req.total += piece.shape[-1]
