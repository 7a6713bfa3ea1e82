"""Robot policies: one observation in, one action chunk out (the OpenPI server's path, for
Python callers; AsyncOmni's open_robot and act delegate to PolicyCalls). A robot that keeps
calling opens a session (kind "policy") so the engine keeps its episode record and the
calls stay on one replica.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from omni.errors import RequestFailedError
from omni.runtime.pipeline_sessions import PipelineSessions
from omni.session import Session
from omni.wire.arrays import pack_tree


class PolicyCalls:
    """The policy calls of one pipeline; ``generate`` runs a request (AsyncOmni's)."""

    def __init__(self, sessions: PipelineSessions,
                 generate: Callable[..., AsyncIterator[Any]]) -> None:
        self.sessions, self.generate = sessions, generate

    def open_robot(self, **params: Any) -> Session:
        """A session for one robot's episode; SessionCapacityError when full."""
        return self.sessions.open("policy", params)

    async def act(self, observation: dict[str, Any], *, seed: int | None = None,
                  steps: int | None = None, session: Session | None = None
                  ) -> dict[str, Any]:
        """The action chunk for ``observation`` (numpy arrays as the robot has them):
        {"actions": float32 torch tensor (horizon, width), "seed", "steps", "policy_ms",
        "prepare_ms",
        and "episode_step" with a session}."""
        params = {k: v for k, v in (("seed", seed), ("steps", steps)) if v is not None}
        if session is not None:
            self.sessions.manager.append(session.id, None)
        result = None
        async for out in self.generate({"observation": pack_tree(observation)},
                                       modalities=["actions"], params={"*": params},
                                       session=session):
            if out.data and "actions" in out.data:
                result = out.data
        if result is None:
            raise RequestFailedError("the policy returned no actions")
        return result
