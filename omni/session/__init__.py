"""Sessions: one primitive for long-lived interaction (DESIGN.md §7).

Here: the bookkeeping every kind shares (manager.py) and each kind's turns
(conversation.py, worlds.py). Elsewhere, by layer: the pipeline's ``sessions:`` settings
(omni/config/session_settings.py), the manager wired to a pipeline's engines
(omni/runtime/pipeline_sessions.py), an AR engine's KV kept per session
(omni/engines/ar/session_kv.py).
"""

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
