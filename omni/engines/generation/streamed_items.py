"""Items mode, streamed within units: one runner call advanced over engine steps.

A runner that streams within its units (``streams_units = True``, e.g. a TTS model whose
sentences decode step by step) starts a call with ``start_items(units, params) -> job``
and each later engine step makes one ``advance(job)`` call, which gives ``{row: (media
so far, complete)}`` for the rows with something new; rows are numbered in the order they
entered the call (0, 1, ...). Partial outputs (frames 0) go out as they come; a unit
leaves the call when complete; the call ends when none is left (``job.done``).

A runner that also has ``join_items(job, units, params)`` batches continuously: new units
(numbered on) join the running call between steps and step with the others from the next
advance on; ``drop_items(job, rows)`` takes out the rows of requests that are gone. Without
them new requests wait for the call's end, and an aborted request's row runs on, unseen;
a call whose requests are all aborted is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omni.engines.generation.request import GenRequest


class StreamedItems:
    """The streamed items call in progress: the runner's job and its rows' requests."""

    def __init__(self, runner: Any, group: list[GenRequest]) -> None:
        self.runner = runner
        self.joins = hasattr(runner, "join_items")
        self.key = runner.group_key(group[0].params)  # the requests that may join it
        self.rows: dict[int, GenRequest] = {}
        self.numbered = 0
        self.job = runner.start_items(*self._units(group))
        self._number(group)
        self.dropped = False

    @staticmethod
    def _units(group: list[GenRequest]) -> tuple[list[Any], list[dict[str, Any]]]:
        return [req.units[req.done] for req in group], [req.params for req in group]

    def _number(self, group: list[GenRequest]) -> None:
        for req in group:
            self.rows[self.numbered] = req
            self.numbered += 1

    @property
    def requests(self) -> set[str]:
        """Ids of the requests with a unit in the call."""
        return {req.id for req in self.rows.values()}

    @property
    def done(self) -> bool:
        return self.dropped or bool(getattr(self.job, "done", True))

    def join(self, group: list[GenRequest]) -> None:
        """Each request's next unit joins the call (a runner with join_items)."""
        self.runner.join_items(self.job, *self._units(group))
        self._number(group)

    def advance(self, alive: Mapping[str, Any]) -> list[tuple[GenRequest, Any, int]]:
        """(request, output, units completed: 0 or 1) of each live row with something
        new; nothing, and done, once no request of the call is ``alive``."""
        gone = [n for n, req in self.rows.items() if req.id not in alive]
        if len(gone) == len(self.rows):
            self.dropped = True
            return []
        if gone and hasattr(self.runner, "drop_items"):
            self.runner.drop_items(self.job, gone)
            for n in gone:
                del self.rows[n]
        out = []
        for n, (result, complete) in self.runner.advance(self.job).items():
            req = self.rows.pop(n, None) if complete else self.rows.get(n)
            if req is None or req.id not in alive:
                continue
            if complete:
                req.units[req.done] = None  # its output is about to go out: free it
            out.append((req, result, 1 if complete else 0))
        return out
