"""PromptEncoder (omni/engines/ar/encoder.py): media prompts that find the worker idle
gather until none has arrived for gather_s (at most GATHER_CAP gaps), so a burst that
reaches the engine spread out is encoded in one batch; a caller with nothing else to run
starts the batch at once; prompts that queued behind a busy worker go as soon as it is
free."""

from __future__ import annotations

import threading

from omni.engines.ar.encoder import PromptEncoder
from omni.engines.gather import GATHER_CAP

GAP = 4.0  # the fake clock's seconds: whole numbers, exact in floating point


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def encoder(gather_s: float, gate: threading.Event | None = None) -> tuple[PromptEncoder, Clock]:
    """An encoder whose batch function echoes its inputs (after `gate` opens)."""
    def batch(inputs: list) -> list:
        if gate is not None:
            gate.wait(10)
        return list(inputs)

    clock = Clock()
    return PromptEncoder(batch, gather_s=gather_s, clock=clock), clock


def next_done(enc: PromptEncoder) -> list[str]:
    """Request ids of the next batch that finishes (as an idle engine's steps see it)."""
    while not (done := enc.finished(wait=True)):
        pass
    return [rid for rid, _, _, _ in done]


def test_a_burst_spread_over_gaps_under_gather_s_is_one_batch():
    enc, clock = encoder(GAP)
    enc.submit("a", None, "a")
    assert enc.wait_s() == GAP
    for rid in "bcd":  # each 3 s after the one before: within the gap
        clock.now += 3
        assert enc.finished(wait=False) == [] and enc.batches == []
        enc.submit(rid, None, rid)
    clock.now += 3
    assert enc.wait_s() == 1 and enc.finished(wait=False) == [] and enc.batches == []
    clock.now += 1  # a gap after the last: the batch starts
    assert enc.wait_s() == 0
    assert sorted(next_done(enc)) == list("abcd") and enc.batches == [4]
    enc.shutdown()


def test_a_steady_trickle_is_cut_after_the_cap():
    enc, clock = encoder(GAP)
    enc.submit("r0", None, 0)
    for i in range(1, 2 * GATHER_CAP):
        clock.now += 3
        enc.finished(wait=False)
        if enc.batches:
            break
        enc.submit(f"r{i}", None, i)
    # started GATHER_CAP gaps after the first, whose arrivals (one every 3 s) it took
    assert enc.batches == [GATHER_CAP * 4 // 3 + 1]
    enc.shutdown()


def test_a_caller_with_nothing_else_to_run_starts_the_batch_at_once():
    enc, _ = encoder(GAP)
    enc.submit("a", None, "a")
    assert next_done(enc) == ["a"] and enc.batches == [1]  # no time passed
    enc.shutdown()


def test_no_gathering_encodes_a_lone_prompt_at_once():
    enc, _ = encoder(0.0)
    enc.submit("a", None, "a")
    assert enc.wait_s() == 0
    enc.finished(wait=False)
    assert enc.batches == [1]
    enc.shutdown()


def test_prompts_queued_behind_a_busy_worker_go_as_soon_as_it_is_free():
    gate = threading.Event()
    enc, clock = encoder(GAP, gate)
    enc.submit("a", None, "a")
    clock.now += GAP
    enc.finished(wait=False)  # "a" runs, held by the gate
    enc.submit("b", None, "b")
    enc.submit("c", None, "c")
    assert enc.wait_s() == 0  # they wait for the worker, not for more arrivals
    gate.set()
    assert next_done(enc) == ["a"] and enc.batches == [1, 2]  # no time passed: they started
    assert sorted(next_done(enc)) == ["b", "c"]
    enc.shutdown()


def test_dropping_every_gathering_prompt_ends_the_gathering():
    enc, clock = encoder(GAP)
    enc.submit("a", None, "a")
    enc.drop({"a"})
    assert enc.wait_s() == 0 and not enc
    clock.now += 100
    enc.submit("b", None, "b")  # a new gathering, from its own arrival
    assert enc.wait_s() == GAP
    enc.shutdown()


def test_the_batch_sizes_kept_stay_bounded_while_the_counts_go_on():
    from omni.engines.ar.encoder import KEPT_BATCHES

    enc, _ = encoder(0.0)
    for i in range(KEPT_BATCHES + 10):
        enc.submit(f"r{i}", None, i)
        assert next_done(enc) == [f"r{i}"]
    assert len(enc.batches) == KEPT_BATCHES and enc.batches[-1] == 1
    assert enc.batch_count == enc.prompt_count == KEPT_BATCHES + 10
    assert enc.busy_s > 0  # the worker's time is counted
    enc.shutdown()
