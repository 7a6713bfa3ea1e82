"""Items mode, streamed within units: one runner call advanced over several engine steps.

A runner that streams within its units (``streams_units = True``, e.g. a TTS model whose
sentences decode step by step) starts a call with ``start_items(units, params) -> job``
and each later engine step makes one ``advance(job)`` call, which gives per row its media
so far (or None: nothing yet) and whether its unit is complete with it. Partial outputs
(frames 0) go out as they come; new requests wait for the call's end (``job.done``); an
aborted request's row runs on, unseen, until the call ends, and a call whose requests are
all aborted is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omni.engines.generation.request import GenRequest


class StreamedItems:
    """The streamed items call in progress: the runner's job and its requests, in rows."""

    def __init__(self, runner: Any, group: list[GenRequest]) -> None:
        self.group = group
        units = [req.units[req.done] for req in group]
        self.job = runner.start_items(units, [req.params for req in group])

        self.dropped = False

    @property
    def done(self) -> bool:
        return self.dropped or bool(getattr(self.job, "done", True))

    def advance(self, runner: Any, alive: Mapping[str, Any]) -> list[tuple[GenRequest, Any, int]]:
        """(request, output, units completed: 0 or 1) of each live row with something
        new; nothing, and done, once no request of the call is ``alive``."""
        if not any(req.id in alive for req in self.group):
            self.dropped = True
            return []
        out = []
        for req, (result, complete) in zip(self.group, runner.advance(self.job), strict=True):
            if req.id in alive and (result is not None or complete):
                if complete:
                    req.units[req.done] = None  # its output is about to go out: free it
                out.append((req, result, 1 if complete else 0))
        return out
