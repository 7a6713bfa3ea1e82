"""The session primitive on a fake clock: capacity, leases, LRU under a byte budget,
fences, reset, detach and resume."""

from __future__ import annotations

import pytest

from omni.session import (
    SessionCapacityError,
    SessionError,
    SessionManager,
    SessionNotFoundError,
    StaleFenceError,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def manager(**kwargs) -> tuple[SessionManager, Clock, list]:
    clock, evicted = Clock(), []
    m = SessionManager(clock=clock, on_evict=evicted.append, **kwargs)
    return m, clock, evicted


def test_capacity_refuses_at_once_and_frees_on_close():
    m, _, _ = manager(max_sessions=2)
    a, _b = m.open("conversation"), m.open("conversation")
    with pytest.raises(SessionCapacityError, match="maximum of 2"):
        m.open("conversation")
    assert m.close(a.id) and not m.close(a.id)
    assert m.open("conversation").id not in (a.id,)
    assert len(m) == 2


def test_idle_lease_reaps_unused_sessions_but_not_busy_ones():
    m, clock, _ = manager(idle_ttl_s=10)
    idle, used, busy = (m.open("conversation") for _ in range(3))
    ended = []
    idle.on_end.append(lambda s, reason: ended.append((s.id, reason)))
    busy.busy = 1
    clock.now += 6
    m.append(used.id)
    clock.now += 5  # idle: 11 s without use; used: 5 s
    assert m.reap() == [idle.id]
    assert ended == [(idle.id, "idle for 10 s")] and idle.closed
    with pytest.raises(SessionNotFoundError):
        m.get(idle.id)
    clock.now += 100
    assert m.reap() == [used.id]  # busy stays while its turn runs
    busy.busy = 0
    assert m.reap() == [busy.id]


def test_a_full_pipeline_reaps_expired_sessions_before_refusing():
    m, clock, _ = manager(max_sessions=1, idle_ttl_s=5)
    first = m.open("conversation")
    ended = []
    first.on_end.append(lambda s, reason: ended.append((s.id, reason)))
    clock.now += 4
    with pytest.raises(SessionCapacityError, match="maximum of 1"):
        m.open("conversation")  # not expired yet: refused, and the first is kept
    assert ended == [] and m.get(first.id) is first
    clock.now += 1
    try:
        second = m.open("conversation")  # the first expired: its place is free
    except SessionCapacityError as exc:
        pytest.fail(f"refused although the only session's lease had run out: {exc}")
    assert ended == [(first.id, "idle for 5 s")] and first.closed == "idle for 5 s"
    assert list(m.sessions) == [second.id] and second.id != first.id and len(m) == 1
    with pytest.raises(SessionNotFoundError):
        m.get(first.id)


def test_lru_eviction_under_a_byte_budget_keeps_sessions_open():
    m, clock, evicted = manager(byte_budget=300)
    s = [m.open("conversation") for _ in range(4)]
    for session in s:
        clock.now += 1
        m.touch(session)
    assert m.report_bytes("llm-0", {x.id: 100 for x in s[:3]}) == []  # fits exactly
    assert m.report_bytes("llm-1", {s[3].id: 100}) == [s[0].id]  # the least recent goes
    assert evicted == [s[0]] and m.evictions == 1 and s[0].nbytes == 0
    assert m.held_bytes == 300 and len(m) == 4  # evicted, still open
    clock.now += 1
    m.touch(s[0])
    m.touch(s[1])  # now s[2] is the least recently used holder
    s[3].busy = 1  # a running turn is never evicted
    assert m.report_bytes("llm-0", {x.id: 100 for x in s[:3]}) == [s[2].id]
    assert m.report_bytes("llm-1", {s[3].id: 400}) == [s[0].id, s[1].id]
    assert m.held_bytes == 400  # over, but only the busy one is left


def test_reports_replace_what_a_holder_held():
    m, _, _ = manager()
    a = m.open("conversation")
    m.report_bytes("llm-0", {a.id: 4096})
    m.report_bytes("llm-1", {a.id: 1024})
    assert a.nbytes == 5120
    m.report_bytes("llm-0", {})  # freed there
    assert a.held_bytes == {"llm-1": 1024}
    assert m.forget_holder("llm-1") == [a] and a.nbytes == 0
    m.report_bytes("llm-0", {"not-a-session": 10, a.id: 0})
    assert m.held_bytes == 0


def test_stale_fences_are_rejected_and_old_outputs_dropped():
    m, _, _ = manager()
    a = m.open("conversation")
    first = a.fence
    m.append(a.id, first)
    committed = m.signal(a.id, "commit", first)
    assert committed == (0, 1)
    with pytest.raises(StaleFenceError, match=r"\(0, 0\) is not the current \(0, 1\)"):
        m.append(a.id, first)  # a late append of the committed turn
    assert m.accepts(a, committed) and not m.accepts(a, first)
    cancelled = m.signal(a.id, "cancel", committed)
    assert not m.accepts(a, committed) and m.accepts(a, cancelled)
    with pytest.raises(StaleFenceError):
        m.signal(a.id, "interrupt", committed)
    with pytest.raises(ValueError, match="unknown signal"):
        m.signal(a.id, "pause")


def test_reset_starts_a_new_epoch_and_drops_engine_state():
    m, _, evicted = manager()
    a = m.open("conversation")
    m.report_bytes("llm-0", {a.id: 100})
    m.signal(a.id, "commit")
    fence = m.signal(a.id, "reset")
    assert fence == (1, 0) and evicted == [a] and a.nbytes == 0
    assert m.evictions == 0  # a reset is not an eviction
    assert not m.accepts(a, (0, 1))
    m.close(a.id)
    assert not m.accepts(a, fence)  # a closed session accepts nothing


def test_resume_within_grace_and_not_after():
    m, clock, _ = manager(resume_grace_s=30, idle_ttl_s=1000)
    a, b = m.open("conversation"), m.open("conversation")
    with pytest.raises(SessionError, match="attached to another connection"):
        m.attach(a.resume_token)
    m.detach(a.id)
    m.detach(b.id)
    clock.now += 29
    assert m.attach(a.resume_token) is a and a.attached
    clock.now += 1  # b: 30 s detached
    with pytest.raises(SessionNotFoundError, match="grace period"):
        m.attach(b.resume_token)
    assert b.closed == "resume grace period expired"
    with pytest.raises(SessionNotFoundError):
        m.attach("made-up-token")


def test_next_deadline_follows_leases():
    m, clock, _ = manager(idle_ttl_s=10, resume_grace_s=3)
    assert m.next_deadline() is None
    a = m.open("conversation")
    assert m.next_deadline() == clock.now + 10
    m.detach(a.id)
    assert m.next_deadline() == clock.now + 3
