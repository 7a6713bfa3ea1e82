"""Hop timing (omni/wire/transit.py): a message's time splits into the wait behind a running
engine step and the hop itself; the orchestrator's per-request sums add both directions."""

from __future__ import annotations

import pytest

from omni.runtime.request_transit import RequestTransit
from omni.wire import transit
from omni.wire.transit import InboundTimes


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(transit.time, "monotonic", lambda: now[0])
    return now


def test_idle_engine_hop_is_all_transit(clock):
    times = InboundTimes()
    times.step_done()  # t=100
    clock[0] = 100.5
    times.received("r", sent_at=100.2)
    assert times.take(["r"]) == {"r": [pytest.approx(0.3), 0.0, 1, pytest.approx(0.3), 0.0]}
    assert times.take(["r"]) == {}  # reported once


def test_message_sent_mid_step_waits_for_the_step(clock):
    times = InboundTimes()
    clock[0] = 101.0
    times.step_done()  # the step ran 100.0 .. 101.0; the message was sent at 100.4
    clock[0] = 101.01
    times.received("r", sent_at=100.4)
    times.received("r", sent_at=100.9)
    hop, wait, count, last_hop, last_wait = times.take(["r", "other"])["r"]
    assert count == 2
    assert hop == pytest.approx(0.02) and wait == pytest.approx(0.6 + 0.1)
    assert last_hop == pytest.approx(0.01) and last_wait == pytest.approx(0.1)


def test_dropped_requests_report_nothing(clock):
    times = InboundTimes()
    times.received("gone", sent_at=99.0)
    times.drop("gone")
    assert times.take(["gone"]) == {}


def test_request_sums_both_directions_and_the_last_output_chain():
    request = RequestTransit()
    request.add_inbound("a", [0.002, 0.010, 2, 0.001, 0.004])
    request.add_output("a", sent_at=5.0, now=5.001)
    request.add_output("a", sent_at=6.0, now=6.003)  # the last output of stage a counts
    request.add_output("a", sent_at=None, now=7.0)  # an engine that stamps nothing adds nothing
    request.add_inbound("b", [0.001, 0.0, 1, 0.001, 0.0])
    request.add_inbound("b", None)
    assert request.summary() == {"hop_s": 0.007, "step_wait_s": 0.01, "messages": 5,
                                 "chain_hop_s": 0.005, "chain_step_wait_s": 0.004}


def test_malformed_stamps_are_ignored(clock):
    times = InboundTimes()
    times.received("r", sent_at="soon")
    times.received("r", sent_at=None)
    assert times.take(["r"]) == {}
    request = RequestTransit()
    request.add_output("a", sent_at="x", now=1.0)
    request.add_inbound("a", ["x", 0.0, 1, 0.0, 0.0])
    request.add_inbound("a", [0.1, 0.2])
    assert request.summary()["messages"] == 0


def test_step_durations_are_reported_once_and_bounded(clock):
    times = InboundTimes()
    clock[0] = 100.25
    times.step_done(started=100.0)
    clock[0] = 101.0
    times.step_done(started=100.5)
    times.step_done()  # no start: counts for waits only
    assert times.take_steps() == [0.25, 0.5]
    assert times.take_steps() == []
    for _ in range(transit.MAX_STEP_TIMES + 10):
        times.step_done(started=100.0)
    assert len(times.take_steps()) == transit.MAX_STEP_TIMES


def test_chain_wait_and_hop_by_stage():
    request = RequestTransit()
    request.add_inbound("a", [0.002, 0.010, 2, 0.001, 0.004])
    request.add_inbound("b", [0.001, 0.3, 1, 0.001, 0.3])
    request.add_inbound("b", [0.001, 0.0, 1, 0.001, 0.02])  # the last input counts
    assert request.chain_wait_by_stage() == {"a": 0.004, "b": 0.02}
    request.add_output("b", 10.0, 10.25)
    request.add_output("b", 11.0, 11.5)  # the last output counts
    assert request.chain_hop_by_stage() == {"a": (0.001, 0.0), "b": (0.001, 0.5)}
