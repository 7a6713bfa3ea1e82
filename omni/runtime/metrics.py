"""Prometheus metrics: events are counted as they happen, gauges read at scrape time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                   30, 60, 120, 300, 600)

RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10)


class Metrics:
    """One registry per server; orchestrators report through `for_pipeline`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("omni_requests", "Requests finished, by outcome",
                                ["pipeline", "outcome"], registry=r)
        self.latency = Histogram("omni_request_latency_seconds", "Arrival to finish",
                                 ["pipeline"], buckets=LATENCY_BUCKETS, registry=r)
        self.first_output = Histogram("omni_first_output_seconds",
                                      "Arrival to first client-visible output", ["pipeline"],
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.stage_latency = Histogram("omni_stage_latency_seconds",
                                       "Stage dispatch to stage finish", ["pipeline", "stage"],
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.stage_first_output = Histogram(
            "omni_stage_first_output_seconds", "Per finished request and stage: arrival to "
            "the stage's first output (where a first packet's time goes, stage by stage)",
            ["pipeline", "stage"], buckets=LATENCY_BUCKETS, registry=r)
        # spoken answers, as the client sees them (omni/media/playback.py)
        self.ttft = Histogram("omni_ttft_seconds", "Arrival to first text", ["pipeline"],
                              buckets=LATENCY_BUCKETS, registry=r)
        self.ttfp = Histogram("omni_ttfp_seconds", "Arrival to first audio packet",
                              ["pipeline"], buckets=LATENCY_BUCKETS, registry=r)
        self.rtf = Histogram("omni_rtf", "Time to the last audio packet / audio seconds",
                             ["pipeline"], buckets=RTF_BUCKETS, registry=r)
        self.underrun = Histogram("omni_audio_underrun_seconds",
                                  "Worst playback deficit of a real-time player",
                                  ["pipeline"], buckets=(0,) + LATENCY_BUCKETS, registry=r)
        # omni/wire/transit.py: per request, over its messages (all) or its last-output chain
        self.hop = Histogram("omni_request_hop_seconds", "Per request: time its messages "
                             "spent in sockets, decoding and our event loops",
                             ["pipeline", "messages"], buckets=(0,) + LATENCY_BUCKETS,
                             registry=r)
        self.step_wait = Histogram("omni_request_step_wait_seconds", "Per request: time its "
                                   "inputs waited behind an engine step already running",
                                   ["pipeline", "messages"], buckets=(0,) + LATENCY_BUCKETS,
                                   registry=r)
        self.stage_step_wait = Histogram(
            "omni_stage_step_wait_seconds", "Per request and stage: how long the stage's last "
            "input for it waited behind an engine step already running",
            ["pipeline", "stage"], buckets=(0,) + LATENCY_BUCKETS, registry=r)
        self.stage_hop = Histogram(
            "omni_stage_hop_seconds", "Per request and stage: the hop of the stage's last "
            "input for it (direction in) and of its last output (out)",
            ["pipeline", "stage", "direction"], buckets=(0,) + LATENCY_BUCKETS, registry=r)
        self.engine_step = Histogram("omni_engine_step_seconds", "Duration of one engine step",
                                     ["pipeline", "stage"], buckets=(0,) + LATENCY_BUCKETS,
                                     registry=r)
        self.engine_gc_pause = Histogram(
            "omni_engine_gc_pause_seconds", "A garbage collection of 1 ms or more in an engine "
            "process (it holds the stage's every request)", ["pipeline", "stage"],
            buckets=LATENCY_BUCKETS, registry=r)
        self.gauges = _GaugeCollector()
        r.register(self.gauges)

    def observe_playback(self, pipeline: str, summary: dict[str, float | None]) -> None:
        """One spoken answer's PlaybackClock summary."""
        for histogram, key in ((self.ttft, "ttft_s"), (self.ttfp, "ttfp_s"),
                               (self.rtf, "rtf"), (self.underrun, "underrun_s")):
            if summary.get(key) is not None:
                histogram.labels(pipeline).observe(summary[key])

    def for_pipeline(self, pipeline: str, stages: Iterable[str]) -> PipelineMetrics:
        return PipelineMetrics(self, pipeline, list(stages))

    def watch(self, source: Callable[[], Iterable[Sample]]) -> None:
        """Register a scrape-time source yielding (kind, name, help, labels, value).

        For per-message numbers: the hot path bumps plain ints (a prometheus_client
        counter takes a lock per update) and the scrape reads them.
        """
        self.gauges.sources.append(source)


class PipelineMetrics:
    """One pipeline's metric children, bound once: ``.labels()`` looks a child up under a
    lock, a few microseconds on every hop of every request otherwise."""

    def __init__(self, metrics: Metrics, pipeline: str, stages: list[str]) -> None:
        m, p = metrics, pipeline
        self.requests = m.requests
        self.pipeline = p
        self.latency = m.latency.labels(p)
        self.first_output = m.first_output.labels(p)
        self.hop = {k: m.hop.labels(p, k) for k in ("all", "chain")}
        self.step_wait = {k: m.step_wait.labels(p, k) for k in ("all", "chain")}
        self.stage_latency = {s: m.stage_latency.labels(p, s) for s in stages}
        self.stage_first = {s: m.stage_first_output.labels(p, s) for s in stages}
        self.stage_step_wait = {s: m.stage_step_wait.labels(p, s) for s in stages}
        self.stage_hop = {(s, d): m.stage_hop.labels(p, s, d) for s in stages
                          for d in ("in", "out")}
        self.engine_step = {s: m.engine_step.labels(p, s) for s in stages}
        self.engine_gc_pause = {s: m.engine_gc_pause.labels(p, s) for s in stages}

    def observe_transit(self, transit: Any) -> None:
        """One finished request's RequestTransit."""
        self.hop["all"].observe(transit.hop_s)
        self.hop["chain"].observe(transit.chain_hop_s)
        self.step_wait["all"].observe(transit.wait_s)
        self.step_wait["chain"].observe(transit.chain_wait_s)
        for stage, wait in transit.chain_wait_by_stage().items():
            self.stage_step_wait[stage].observe(wait)
        for stage, (hop_in, hop_out) in transit.chain_hop_by_stage().items():
            self.stage_hop[stage, "in"].observe(hop_in)
            self.stage_hop[stage, "out"].observe(hop_out)


Sample = tuple[str, str, str, dict[str, str], float]  # kind is "gauge" or "counter"
_FAMILIES = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}


class _GaugeCollector(Collector):
    def __init__(self) -> None:
        self.sources: list[Callable[[], Iterable[Sample]]] = []

    def collect(self) -> Iterable[Any]:
        families: dict[str, Any] = {}
        for source in self.sources:
            for kind, name, help_text, labels, value in source():
                family = families.get(name)
                if family is None:
                    family = families[name] = _FAMILIES[kind](name, help_text,
                                                              labels=list(labels))
                family.add_metric(list(labels.values()), value)
        return list(families.values())


# engine stats (last report of each replica) exported as gauges, where an engine has them
ENGINE_GAUGES = {
    "running": ("omni_replica_running", "Requests running in the replica's engine"),
    "waiting": ("omni_replica_waiting", "Requests queued in the replica's engine scheduler"),
    "kv_blocks_used": ("omni_replica_kv_blocks_used", "KV cache blocks in use (AR engines)"),
    "kv_blocks_total": ("omni_replica_kv_blocks_total", "KV cache blocks (AR engines)"),
    "prefix_cache_hits": ("omni_replica_prefix_cache_hits",
                          "KV blocks reused from the prefix cache since start"),
    "preemptions": ("omni_replica_preemptions", "Sequences preempted for KV space since start"),
    "transformer_calls": ("omni_replica_transformer_calls",
                          "Denoiser calls since start (diffusion engines)"),
    "rows_run": ("omni_replica_denoise_rows",
                 "Rows denoised (diffusion) or robots stepped (policy) since start"),
    "steps_skipped": ("omni_replica_steps_skipped",
                      "Denoising steps served from the step cache since start"),
    "step_calls": ("omni_replica_policy_step_calls",
                   "Flow-matching forward calls since start (policy engines)"),
    "chunks": ("omni_replica_policy_chunks", "Action chunks made since start (policy engines)"),
    "max_rows": ("omni_replica_max_batch_rows",
                 "The most requests one model call has run (diffusion and policy engines)"),
    "tensor_bytes": ("omni_replica_tensor_bytes",
                     "Bytes of latents and conditioning held (diffusion engines)"),
    "encoder_batches": ("omni_replica_encoder_batches",
                        "Media-prompt encoder batches run since start (AR engines)"),
    "encoder_prompts": ("omni_replica_encoder_prompts",
                        "Media prompts encoded since start (AR engines; / batches = mean "
                        "batch)"),
    "encoder_seconds": ("omni_replica_encoder_seconds",
                        "Seconds the media-prompt encoder worked since start (AR engines)"),
}


def replica_samples(pipeline: str, replica: Any) -> Iterable[Sample]:
    """One engine replica's memory and its last reported engine stats."""
    labels = {"pipeline": pipeline, "stage": replica.stage, "replica": replica.replica_id}
    for key, kind in (("rss_bytes", "host"), ("cuda_bytes", "cuda")):
        if key in replica.info:
            yield "gauge", "omni_replica_memory_bytes", \
                "Memory of a replica once loaded (host RSS, GPU reserved)", \
                {**labels, "kind": kind}, replica.info[key]
    if isinstance(replica.info.get("gc_frozen"), int):
        yield "gauge", "omni_replica_gc_frozen_objects", \
            "Objects taken out of garbage collection once loaded (omni/heap.py)", labels, \
            replica.info["gc_frozen"]
    if "shm_used_bytes" in replica.stats:
        yield "gauge", "omni_replica_arena_used_bytes", \
            "Bytes of the replica's payload arena in use (last report)", labels, \
            replica.stats["shm_used_bytes"]
    if "zmq_payload_bytes" in replica.stats:
        yield "gauge", "omni_replica_remote_payload_bytes", \
            "Bytes the replica holds for consumers on other hosts (zmq data socket)", labels, \
            replica.stats["zmq_payload_bytes"]
    for key, (metric, doc) in ENGINE_GAUGES.items():
        value = replica.stats.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            yield "gauge", metric, doc, labels, value


def pipeline_samples(orchestrator: Any) -> Iterable[Sample]:
    """The gauges and counters of one orchestrator's pipeline, read at scrape time."""
    name = orchestrator.pipeline.name
    yield "gauge", "omni_requests_in_flight", "Requests admitted, not finished", \
        {"pipeline": name}, len(orchestrator.requests)
    for stage, pool in orchestrator.engines.pools.items():
        labels = {"pipeline": name, "stage": stage}
        yield "gauge", "omni_stage_queue_length", "Requests bound to a stage, not finished", \
            labels, pool.queue_length()
        yield "gauge", "omni_stage_replicas_live", "Live replicas per stage", labels, \
            len(pool.live())
    for replica in orchestrator.engines.replicas.values():
        yield from replica_samples(name, replica)
    for (stage, direction), count in orchestrator.control_bytes.items():
        yield "counter", "omni_control_bytes", "Control-plane bytes moved per stage", \
            {"pipeline": name, "stage": stage, "direction": direction}, count


# -- per request: what the orchestrator records when a request ends ----------------------


def end_request(measure: PipelineMetrics, state: Any, outcome: str) -> dict[str, Any]:
    """Record an ended request (a RequestState) in its pipeline's histograms; return its
    timings, relative to its arrival, which its last output carries to the client."""
    measure.requests.labels(measure.pipeline, outcome).inc()
    now, base = time.monotonic(), state.arrived
    if outcome == "ok":
        measure.latency.observe(now - base)
        if state.first_output is not None:
            measure.first_output.observe(state.first_output - base)
        measure.observe_transit(state.transit)
        for stage, times in state.times.items():
            if "first_output" in times:
                measure.stage_first[stage].observe(times["first_output"] - base)
    stages = {s: {k: round(v - base, 6) for k, v in t.items()} for s, t in state.times.items()}
    first = None if state.first_output is None else round(state.first_output - base, 6)
    return {"e2e_s": round(now - base, 6), "first_output_s": first, "stages": stages,
            "transit": state.transit.summary()}


def observe_durations(histogram: Any, durations: Any) -> None:
    """An engine report's list of durations (steps, GC pauses) into a histogram."""
    if isinstance(durations, list):
        for seconds in durations:
            if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
                histogram.observe(seconds)
