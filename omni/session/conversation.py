"""The ``conversation`` session kind: a chat whose turns share one history.

Appends are chat messages (``{"role", "content"}``, content a string or a list of
OpenAI content parts); a response runs the whole history as one request of the session
(its AR stages keep the history's KV between turns, so a turn prefills only what is new:
omni/engines/ar/session_kv.py) and, when it ends, its text joins the history as the
assistant's message: whole when it completed, the part produced so far when it was
cancelled or interrupted (what a listener heard before the barge-in).

``ConversationTurns`` runs the turns of a pipeline's conversations (AsyncOmni's append,
signal, respond and close_session); ``Conversation`` is one session's history.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from omni.errors import RequestAbortedError
from omni.session.manager import Fence, Session, SessionError, SessionManager

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


class ConversationTurns:
    """The turns of one pipeline's conversation sessions. ``generate`` runs a request
    (AsyncOmni.generate), ``abort(request_id, reason)`` stops one wherever it runs."""

    def __init__(self, manager: SessionManager, generate: Callable[..., AsyncIterator[Any]],
                 abort: Callable[[str, str], Any]) -> None:
        self.manager, self.generate, self.abort = manager, generate, abort

    def append(self, session_id: str, item: dict[str, Any], fence: Fence | None = None) -> None:
        """One chat message of the session's current turn."""
        session = self.manager.append(session_id, fence)
        conversation(session).add(item)

    def signal(self, session_id: str, kind: str, fence: Fence | None = None) -> Fence:
        """commit, cancel / interrupt (the running response stops), reset (the history
        goes too); the session's new fence."""
        session = self.manager.get(session_id)
        chat = conversation(session)
        new = self.manager.signal(session_id, kind, fence)
        if kind != "commit" and chat.running is not None:
            self.abort(chat.running, f"session {kind}")
        if kind == "reset":
            chat.reset()
        return new

    def close(self, session_id: str, reason: str) -> bool:
        """Close a session of any kind; a conversation's running response stops first."""
        session = self.manager.sessions.get(session_id)
        if session is not None and session.kind == "conversation":
            running = conversation(session).running
            if running is not None:
                self.abort(running, "the session closed")
        return self.manager.close(session_id, reason)

    async def respond(self, session_id: str, *, fence: Fence | None = None,
                      modalities: Iterable[str] | None = None,
                      params: Mapping[str, Mapping[str, Any]] | None = None,
                      view: str | None = None, instructions: str | None = None,
                      inputs: Mapping[str, Any] | None = None) -> AsyncIterator[Any]:
        """The conversation so far answered as one turn (see AsyncOmni.respond)."""
        session = self.manager.append(session_id, fence)
        chat = conversation(session)
        if chat.running is not None:
            raise SessionError(f"session {session_id} is already answering; cancel first")
        messages = ([{"role": "system", "content": instructions}] if instructions else []) \
            + chat.messages
        chat.running, texts = uuid.uuid4().hex, []
        session.busy += 1
        try:
            # the history is text (audio arrives transcribed): no entry stage that hears
            async for out in self.generate({**(inputs or {}), "messages": messages},
                                           modalities=modalities,
                                           params=params, request_id=chat.running,
                                           view=view, session=session,
                                           input_modalities=["text"]):
                if out.modality == "text" and out.data:
                    texts.append(out.data.get("text") or "")
                yield out
        except RequestAbortedError:
            chat.answered("".join(texts))
            raise
        else:
            chat.answered("".join(texts))
        finally:
            session.busy -= 1
            chat.running = None
            self.manager.touch(session)
