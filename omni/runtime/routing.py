"""How a request's data moves along the edges of its route (full vs stream delivery).

A consumer fed only by ``stream`` edges starts with the request (it waits for input in
its engine, with no placeholder tokens or guessed lengths); one with ``full`` producers
starts when all of those have finished. Stream producers' chunks reach their consumers
as numbered APPENDs, the last one flagged, whatever the consumer's start time.

Entry stages get the client's inputs. A stage fed by producers gets their chunks, plus the
client input keys it lists in ``takes_request`` (e.g. an LLM after a speech recognizer
takes the chat ``messages`` and the transcripts of their audio parts).

A request submitted with ``stream_input`` (audio as it is spoken) also tells its entry
stages to expect stream input from ``CLIENT``, the client itself: its later input then
reaches them as numbered APPENDs, like a producer stage's (``Orchestrator.feed``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omni.config.pipeline import PipelineConfig, Route
from omni.config.request_defaults import stage_defaults

CLIENT = "client"  # the producer name of a client's stream input: no stage may be called so


@dataclass(frozen=True)
class RoutePlan:
    route: Route
    start: tuple[str, ...]  # dispatched at admission, in topological order
    full_producers: dict[str, tuple[str, ...]]
    stream_producers: dict[str, tuple[str, ...]]
    full_consumers: dict[str, tuple[str, ...]]
    stream_consumers: dict[str, tuple[str, ...]]
    final_modality: dict[str, str]  # final stage -> the output modality it gives here
    request_keys: dict[str, tuple[str, ...]]  # non-entry stage -> client keys it takes
    # stage -> its default params on this route: its `params`, then the pipeline's
    # `defaults:` for the modalities asked for (omni/config/request_defaults.py); only read
    params: dict[str, dict[str, Any]] = field(default_factory=dict)

    def start_inputs(self, stage: str, client_inputs: dict[str, Any],
                     client_stream: bool = False) -> dict[str, Any]:
        """Entry stages get the client's inputs (and the client as their stream producer
        with ``client_stream``); stream-fed ones their producer list."""
        if stage in self.route.entries:
            return {**client_inputs, "stream": [CLIENT]} if client_stream else client_inputs
        return {"stream": list(self.stream_producers[stage])}

    def ready_inputs(self, stage: str, chunks: dict[str, list],
                     client_inputs: dict[str, Any]) -> dict[str, Any]:
        """Inputs of a stage whose full producers have all finished."""
        inputs: dict[str, Any] = {k: client_inputs[k] for k in self.request_keys.get(stage, ())
                                  if k in client_inputs}
        inputs.update({p: chunks.get(p, []) for p in self.full_producers[stage]})
        if self.stream_producers[stage]:
            inputs["stream"] = list(self.stream_producers[stage])
        return inputs


def plan_route(pipeline: PipelineConfig, route: Route) -> RoutePlan:
    def split(pairs: dict[str, tuple[str, ...]], src_first: bool) -> tuple[dict, dict]:
        full, stream = {}, {}
        for stage, others in pairs.items():
            kinds = [(o, _delivery(pipeline, o, stage) if src_first else
                      _delivery(pipeline, stage, o)) for o in others]
            full[stage] = tuple(o for o, k in kinds if k == "full")
            stream[stage] = tuple(o for o, k in kinds if k == "stream")
        return full, stream

    full_producers, stream_producers = split(dict(route.producers), True)
    full_consumers, stream_consumers = split(dict(route.consumers), False)
    start = tuple(s for s in route.stages
                  if s in route.entries or (stream_producers[s] and not full_producers[s]))
    finals = {s: pipeline.stage(s).final_output for s in route.finals}
    keys = {s: pipeline.stage(s).takes_request for s in route.stages
            if s not in route.entries and pipeline.stage(s).takes_request}
    params = {s: stage_defaults(pipeline.stage(s).params, pipeline.defaults, s,
                                route.modalities) for s in route.stages}
    return RoutePlan(route, start, full_producers, stream_producers, full_consumers,
                     stream_consumers, finals, keys, params)


def _delivery(pipeline: PipelineConfig, src: str, dst: str) -> str:
    return pipeline.edge(src, dst).delivery
