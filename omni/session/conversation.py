"""The ``conversation`` session kind: a chat whose turns share one history.

Appends are chat messages (``{"role", "content"}``, content a string or a list of
OpenAI content parts); a response runs the whole history as one request of the session
(its AR stages keep the history's KV between turns, so a turn prefills only what is new:
omni/engines/ar/session_kv.py) and, when it ends, its text joins the history as the
assistant's message: whole when it completed, the part produced so far when it was
cancelled or interrupted (what a listener heard before the barge-in).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omni.session.manager import Session, SessionError

ROLES = ("system", "user", "assistant")
MAX_MESSAGES = 1024  # a conversation longer than this is a client bug, not a chat


@dataclass
class Conversation:
    messages: list[dict[str, Any]] = field(default_factory=list)
    running: str | None = None  # the request id of the response running now

    def add(self, message: Any) -> dict[str, Any]:
        """Append a chat message; ValueError saying what is wrong with a bad one."""
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise ValueError(f"a conversation item is a message with a role among "
                             f"{', '.join(ROLES)}, got {str(message)[:80]!r}")
        content = message.get("content")
        if not isinstance(content, str | list):
            raise ValueError("a message's content is a string or a list of content parts")
        if len(self.messages) >= MAX_MESSAGES:
            raise ValueError(f"the conversation holds its maximum of {MAX_MESSAGES} messages")
        item = {"role": message["role"], "content": content}
        self.messages.append(item)
        return item

    def answered(self, text: str) -> None:
        if text:
            self.messages.append({"role": "assistant", "content": text})

    def reset(self) -> None:
        self.messages.clear()


def conversation(session: Session) -> Conversation:
    """The conversation of a ``conversation`` session."""
    if session.kind != "conversation":
        raise SessionError(f"session {session.id} is a {session.kind!r} session, "
                           "not a conversation")
    return session.state.setdefault("conversation", Conversation())
