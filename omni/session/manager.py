"""Sessions: long-lived identities that outlive one generation (DESIGN.md §7).

A session is opened, fed (append), steered (signal: commit, cancel/interrupt, reset) and
closed. This module is the bookkeeping every kind shares, with no sockets, no asyncio and
an injectable clock (tests run it on a fake one):

- capacity: at most ``max_sessions`` per pipeline; one more is refused at once
  (SessionCapacityError), never queued;
- idle lease: a session unused for ``idle_ttl_s`` is reaped (closed);
- byte budget: engines report the bytes of per-session state they hold (an AR stage's
  KV blocks); while the total is over ``byte_budget``, the least recently used session's
  engine state is dropped (evicted). The session stays open; its next turn recomputes;
- fences: ``(epoch, turn)``. ``commit`` and ``cancel``/``interrupt`` start a new turn,
  ``reset`` a new epoch; an append or an output carrying an older fence is stale and
  never lands in a newer turn;
- detach/attach: a client that loses its connection leaves the session detached; within
  ``resume_grace_s`` its resume token attaches it again, after that it is closed.

What a session *does* with its input belongs to its kind (omni/session/conversation.py);
what the engines keep for it, to the engines. The manager tells them through callbacks:
``on_evict(session)`` (drop engine state) and each session's ``on_end`` (it closed, and
why), so the layer above can release engine state and tell its client.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from omni.errors import OmniError


class SessionError(OmniError):
    """Base of the session errors."""


class SessionCapacityError(SessionError):
    """The pipeline holds its maximum number of sessions."""


class SessionNotFoundError(SessionError):
    """No open session has this id (or resume token): never opened, closed or expired."""


class StaleFenceError(SessionError):
    """An append or signal carried the fence of an older turn or epoch."""


class Fence(NamedTuple):
    epoch: int
    turn: int


SIGNALS = ("commit", "cancel", "interrupt", "reset")


@dataclass(eq=False)
class Session:
    """One session. ``state`` belongs to its kind; ``pins`` (stage -> replica) keeps every
    turn on the replicas that hold its engine state (the orchestrator fills it)."""

    id: str
    kind: str
    params: dict[str, Any]
    resume_token: str
    last_used: float
    epoch: int = 0
    turn: int = 0
    attached: bool = True
    detached_at: float | None = None
    busy: int = 0  # turns running now: not reaped while > 0
    closed: str | None = None  # why it ended, once it has
    held_bytes: dict[str, int] = field(default_factory=dict)  # holder (replica) -> bytes
    pins: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    on_end: list[Callable[[Session, str], None]] = field(default_factory=list)

    @property
    def fence(self) -> Fence:
        return Fence(self.epoch, self.turn)

    @property
    def nbytes(self) -> int:
        return sum(self.held_bytes.values())


class SessionManager:
    """The sessions of one pipeline (see module doc)."""

    def __init__(self, *, max_sessions: int = 64, idle_ttl_s: float = 600.0,
                 byte_budget: int | None = None, resume_grace_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic,
                 on_evict: Callable[[Session], None] | None = None) -> None:
        if max_sessions < 1 or idle_ttl_s <= 0 or resume_grace_s < 0:
            raise ValueError("max_sessions >= 1, idle_ttl_s > 0 and resume_grace_s >= 0")
        self.max_sessions, self.idle_ttl_s = max_sessions, idle_ttl_s
        self.byte_budget, self.resume_grace_s = byte_budget, resume_grace_s
        self.clock = clock
        self.on_evict = on_evict
        self.sessions: dict[str, Session] = {}
        self._by_token: dict[str, Session] = {}
        self._holders: dict[str, set[str]] = {}  # holder -> session ids it reported
        self.evictions = 0

    def __len__(self) -> int:
        return len(self.sessions)

    # -- lifecycle ---------------------------------------------------------------------
    def open(self, kind: str, params: dict[str, Any] | None = None) -> Session:
        self.reap()
        if len(self.sessions) >= self.max_sessions:
            raise SessionCapacityError(f"this pipeline holds its maximum of "
                                       f"{self.max_sessions} sessions; retry later")
        session = Session(uuid.uuid4().hex, kind, dict(params or {}),
                          secrets.token_urlsafe(24), self.clock())
        self.sessions[session.id] = session
        self._by_token[session.resume_token] = session
        return session

    def get(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise SessionNotFoundError(f"no open session {session_id!r}")
        return session

    def close(self, session_id: str, reason: str = "closed") -> bool:
        """End a session; its on_end callbacks run once. False if it was not open."""
        session = self.sessions.pop(session_id, None)
        if session is None:
            return False
        self._by_token.pop(session.resume_token, None)
        for holder in session.held_bytes:
            self._holders.get(holder, set()).discard(session.id)
        session.held_bytes.clear()  # on_end callbacks free it in the engines
        session.closed = reason
        for callback in session.on_end:
            callback(session, reason)
        return True

    def close_all(self, reason: str) -> None:
        for session_id in list(self.sessions):
            self.close(session_id, reason)

    # -- input and steering ------------------------------------------------------------
    def check(self, session: Session, fence: Fence | tuple[int, int] | None) -> None:
        """StaleFenceError unless ``fence`` is the session's current one (None: current)."""
        if fence is not None and tuple(fence) != session.fence:
            raise StaleFenceError(f"session {session.id}: fence {tuple(fence)} is not the "
                                  f"current {tuple(session.fence)}")

    def append(self, session_id: str, fence: Fence | tuple[int, int] | None = None) -> Session:
        """Admit one input of the current turn: the session, checked and touched."""
        session = self.get(session_id)
        self.check(session, fence)
        self.touch(session)
        return session

    def signal(self, session_id: str, kind: str,
               fence: Fence | tuple[int, int] | None = None) -> Fence:
        """commit / cancel / interrupt start a new turn; reset a new epoch (and drops the
        session's engine state). Returns the new fence."""
        if kind not in SIGNALS:
            raise ValueError(f"unknown signal {kind!r}; the signals are {', '.join(SIGNALS)}")
        session = self.append(session_id, fence)
        if kind == "reset":
            session.epoch, session.turn = session.epoch + 1, 0
            self._evict(session)
        else:
            session.turn += 1
        return session.fence

    def accepts(self, session: Session, fence: Fence | tuple[int, int]) -> bool:
        """May an output produced under ``fence`` still reach the session's client?"""
        return session.closed is None and tuple(fence) == session.fence

    def touch(self, session: Session) -> None:
        session.last_used = self.clock()

    # -- detach and resume -------------------------------------------------------------
    def detach(self, session_id: str) -> None:
        session = self.sessions.get(session_id)
        if session is not None:
            session.attached, session.detached_at = False, self.clock()

    def attach(self, resume_token: str) -> Session:
        """The detached session this token names, attached again; within the grace only."""
        self.reap()
        session = self._by_token.get(resume_token)
        if session is None:
            raise SessionNotFoundError("no session to resume with this token (it was "
                                       "closed, or its grace period passed)")
        if session.attached:
            raise SessionError("this session is attached to another connection")
        session.attached, session.detached_at = True, None
        self.touch(session)
        return session

    # -- leases ------------------------------------------------------------------------
    def reap(self) -> list[str]:
        """Close sessions whose idle lease or resume grace has run out; their ids."""
        now = self.clock()
        ended = []
        for session in list(self.sessions.values()):
            if session.busy:
                continue
            if not session.attached and now - session.detached_at >= self.resume_grace_s:
                ended.append((session.id, "resume grace period expired"))
            elif now - session.last_used >= self.idle_ttl_s:
                ended.append((session.id, f"idle for {self.idle_ttl_s:g} s"))
        for session_id, reason in ended:
            self.close(session_id, reason)
        return [session_id for session_id, _ in ended]

    def next_deadline(self) -> float | None:
        """When the next lease could run out (for a reaper timer), or None."""
        times = [s.detached_at + self.resume_grace_s if not s.attached
                 else s.last_used + self.idle_ttl_s for s in self.sessions.values()]
        return min(times, default=None)

    # -- engine state bytes ------------------------------------------------------------
    def report_bytes(self, holder: str, by_session: dict[str, int]) -> list[str]:
        """An engine (``holder``) reports what it holds per session now; sessions it
        no longer names hold nothing there. Returns the sessions evicted to fit the
        budget."""
        for session_id in self._holders.get(holder, set()) - set(by_session):
            session = self.sessions.get(session_id)
            if session is not None:
                session.held_bytes.pop(holder, None)
        self._holders[holder] = set()
        for session_id, nbytes in by_session.items():
            session = self.sessions.get(session_id)
            if session is not None and isinstance(nbytes, int) and nbytes > 0:
                session.held_bytes[holder] = nbytes
                self._holders[holder].add(session_id)
        return self.fit_budget()

    def forget_holder(self, holder: str) -> list[Session]:
        """A holder died: the sessions that kept state there (they lose it)."""
        lost = []
        for session_id in self._holders.pop(holder, set()):
            session = self.sessions.get(session_id)
            if session is not None:
                session.held_bytes.pop(holder, None)
                lost.append(session)
        return lost

    @property
    def held_bytes(self) -> int:
        return sum(s.nbytes for s in self.sessions.values())

    def fit_budget(self) -> list[str]:
        """Evict least-recently-used sessions' engine state while over the budget."""
        if self.byte_budget is None:
            return []
        evicted = []
        by_age = sorted((s for s in self.sessions.values() if s.nbytes and not s.busy),
                        key=lambda s: s.last_used)
        total = self.held_bytes
        for session in by_age:
            if total <= self.byte_budget:
                break
            total -= session.nbytes
            self.evictions += 1
            self._evict(session)
            evicted.append(session.id)
        return evicted

    def _evict(self, session: Session) -> None:
        for holder in session.held_bytes:
            self._holders.get(holder, set()).discard(session.id)
        session.held_bytes.clear()  # the engines confirm with their next report
        if self.on_evict is not None:
            self.on_evict(session)
