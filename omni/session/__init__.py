"""Sessions: one primitive for long-lived interaction (DESIGN.md §7)."""

from omni.session.manager import (
    Fence,
    Session,
    SessionCapacityError,
    SessionError,
    SessionManager,
    SessionNotFoundError,
    StaleFenceError,
)

__all__ = ["Fence", "Session", "SessionCapacityError", "SessionError", "SessionManager",
           "SessionNotFoundError", "StaleFenceError"]
