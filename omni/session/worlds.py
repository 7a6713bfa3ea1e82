"""World-model sessions (a pipeline whose video stage is a world model; AsyncOmni's
open_world, world_step and reset_world delegate to WorldSessions):
open with a first frame, a prompt and an embodiment domain; each step sends actions and
yields the next chunk of frames; reset goes back to the first frame.

The engine keeps each session's frames (its world adapter in omni/models/); this side keeps
what it needs to (re)start the rollout: the first frame (PNG), the prompt and the domain,
sent with the first step after opening or a reset. A reset is the session layer's
(a new epoch, the engine state dropped); so is eviction under the session budget, after
which a step is refused until the client resets.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Protocol

import numpy as np

from omni.errors import InvalidInputError
from omni.session import Session, SessionError, SessionManager
from omni.wire.arrays import pack

WORLD = "world"
STEP_PARAMS = ("seed", "steps", "chunk_size", "guidance_scale", "view_point")


def _png(image: Any) -> bytes:
    if isinstance(image, bytes | bytearray) and image:
        return bytes(image)
    if isinstance(image, np.ndarray) and image.ndim == 3 and image.shape[-1] == 3 \
            and image.dtype == np.uint8:
        from omni.media.image import encode_image

        return encode_image(image)
    raise InvalidInputError("the first frame must be image bytes (PNG, JPEG, ...) or a uint8 "
                            "array (H, W, 3)")


class SessionOpener(Protocol):
    """A pipeline's sessions as the runtime wires them to its engines (PipelineSessions):
    ``open`` makes one whose engine state is freed when it ends."""

    manager: SessionManager

    def open(self, kind: str, params: dict[str, Any] | None = None) -> Session: ...


class WorldSessions:
    """The world sessions of one pipeline. ``generate`` runs a request (AsyncOmni's);
    ``video_stages``: the stages whose engine (a world model) reports the ``domains`` it
    serves, read through ``stage_info(stage)``."""

    def __init__(self, sessions: SessionOpener, generate: Callable[..., AsyncIterator[Any]],
                 stage_info: Callable[[str], dict[str, Any]],
                 video_stages: Iterable[str]) -> None:
        self.sessions, self.generate = sessions, generate
        self.stage_info, self.video_stages = stage_info, tuple(video_stages)

    def open(self, image: bytes | np.ndarray, prompt: str, domain: str,
             **defaults: Any) -> Session:
        """A new world session; ``defaults``: step params for every step (seed, steps,
        chunk_size, guidance_scale, view_point). SessionCapacityError when full."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise InvalidInputError("a world session needs a prompt")
        unknown = sorted(set(defaults) - set(STEP_PARAMS))
        if unknown:
            raise InvalidInputError(f"unknown step param(s) {', '.join(unknown)}; "
                                    f"known: {', '.join(STEP_PARAMS)}")
        domains = self._domains()
        if domains and (not isinstance(domain, str) or domain not in domains):
            raise InvalidInputError(f"unknown domain {domain!r}; this model serves "
                                    f"{', '.join(sorted(domains))}")
        session = self.sessions.open(WORLD, {"prompt": prompt, "domain": domain})
        session.state.update(first=_png(image), fresh=True, defaults=dict(defaults))
        return session

    async def step(self, session_id: str, actions: np.ndarray,
                   **params: Any) -> AsyncIterator[Any]:
        """The next chunk: progress outputs, then one with ``video`` uint8 (F, H, W, 3)."""
        session = self.sessions.manager.append(session_id, None)
        if session.kind != WORLD:
            raise SessionError(f"session {session_id} is not a world session")
        if session.busy:
            raise SessionError(f"session {session_id} is already stepping")
        actions = np.asarray(actions)
        if actions.dtype.kind not in "fiu":
            raise InvalidInputError("'actions' must be numbers (T, width)")
        inputs: dict[str, Any] = {"actions": pack(actions), "prompt": session.params["prompt"],
                                  "domain": session.params["domain"]}
        if session.state["fresh"]:
            inputs["image"] = session.state["first"]
        step_params = {**session.state["defaults"], **params}
        session.busy += 1
        try:
            async for out in self.generate(inputs, params={"*": step_params},
                                           session=session):
                if out.data and "video" in out.data:  # the chunk (then the request's end)
                    session.state["fresh"] = False
                yield out
        finally:
            session.busy -= 1
            self.sessions.manager.touch(session)

    def reset(self, session_id: str) -> None:
        """Back to the first frame: the engine drops the rollout, the next step restarts
        it from the first frame."""
        session = self.sessions.manager.get(session_id)
        self.sessions.manager.signal(session_id, "reset")
        session.state["fresh"] = True

    def _domains(self) -> dict[str, int]:
        for stage in self.video_stages:
            domains = self.stage_info(stage).get("domains")
            if domains:
                return domains
        return {}
