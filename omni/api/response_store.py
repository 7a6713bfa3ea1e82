"""Responses kept for ``previous_response_id`` and ``GET``/``DELETE /v1/responses/{id}``
(``store``: true, OpenAI's default).

In this process's memory only: a restart forgets them, and replicas behind a load
balancer do not share them. Each kept response holds its object and the whole
conversation up to it as chat messages (the earlier ones, its input, its output; its
``instructions`` left out, as OpenAI does not carry them over), so a chain does not
depend on older entries that may be gone. Bounded three ways, checked at each ``put``:
at most MAX_RESPONSES entries and MAX_BYTES of their JSON text (the least recently used
go first), and none older than TTL_S (the expiry counts from creation; using an entry
does not extend it). A response whose JSON alone is over MAX_BYTES is not kept.

An entry counts its whole conversation's JSON, but a response that continues another
adds only its new messages' to the count its previous one kept: a chain of N responses
is N serializations of new messages, not N of the whole conversation so far (O(N^2)).
Nor does it copy the conversation: an entry holds its new messages and a link to the
`History` of the response it continues (not to that entry, which may be evicted or
deleted while the link keeps its messages), resolved on reading, so a chain of N
responses holds O(N) message references, not one list of the whole conversation each.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

log = logging.getLogger("omni.api")

MAX_RESPONSES = 1_000
MAX_BYTES = 64 * 2**20
TTL_S = 3_600.0


@dataclass(eq=False, repr=False)  # no comparisons or reprs walking a whole chain
class History:
    """A conversation shared along a chain: the one it continues, then its own messages."""

    parent: History | None
    own: list[dict[str, Any]]

    def messages(self) -> list[dict[str, Any]]:
        parts, node = [], self
        while node is not None:  # a loop, not recursion: chains may be long
            parts.append(node.own)
            node = node.parent
        return [message for part in reversed(parts) for message in part]


@dataclass
class Stored:
    response: dict[str, Any]
    history: History  # the conversation to it, instructions left out
    nbytes: int  # JSON text of the response and its messages: what the bound counts
    expires: float
    messages_nbytes: int  # of the messages: a response continuing this one adds to it

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.history.messages()


def messages_nbytes(messages: list[dict[str, Any]]) -> int:
    """The JSON text of ``messages`` as a list, counted message by message (each one's and
    its separator), so a conversation's count is the sum of its parts'."""
    return sum(len(json.dumps(message)) + 2 for message in messages)


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES,
                 ttl_s: float = TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_responses, self.max_bytes, self.ttl_s = max_responses, max_bytes, ttl_s
        self.clock = clock
        self.entries: OrderedDict[str, Stored] = OrderedDict()  # least recently used first
        self.nbytes = 0

    def put(self, response: dict[str, Any], messages: list[dict[str, Any]],
            previous: Stored | None = None) -> bool:
        """Keep ``response`` with its conversation: ``previous``'s (the response it
        continues, kept or since gone) and then ``messages``. False when it alone is over
        the byte bound."""
        conversation = messages_nbytes(messages)
        history = History(None if previous is None else previous.history, list(messages))
        if previous is not None:
            conversation += previous.messages_nbytes
        nbytes = len(json.dumps(response)) + conversation
        if nbytes > self.max_bytes:
            log.warning("response %s (%d bytes of JSON) is over the store's %d bytes: not "
                        "kept", response["id"], nbytes, self.max_bytes)
            return False
        self.delete(response["id"])
        self.entries[response["id"]] = Stored(response, history, nbytes,
                                              self.clock() + self.ttl_s, conversation)
        self.nbytes += nbytes
        self._bound()
        return True

    def get(self, response_id: str) -> Stored | None:
        entry = self.entries.get(response_id)
        if entry is not None and entry.expires <= self.clock():
            self.delete(response_id)
            return None
        if entry is not None:
            self.entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        entry = self.entries.pop(response_id, None)
        if entry is not None:
            self.nbytes -= entry.nbytes
        return entry is not None

    def _bound(self) -> None:
        now = self.clock()
        for response_id in [k for k, e in self.entries.items() if e.expires <= now]:
            self.delete(response_id)
        while len(self.entries) > self.max_responses or self.nbytes > self.max_bytes:
            self.delete(next(iter(self.entries)))


RESPONSES_KEY = web.AppKey("omni_responses", ResponseStore)
