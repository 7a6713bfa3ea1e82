"""Version skew at the handshake: an engine of another wire version is refused at READY.

Every replica but those of a stage in its own environment runs the server's omni. A stage
environment (omni/runtime/env_process.py) with omni installed runs its own, which may be
older or newer than the server's after either was upgraded; a replica placed by Ray or
started by hand runs whatever its host has. Messages of another version could be
misread, so the launcher refuses such a replica at its first message, naming both
versions and the fix, before anything is sent to it.
"""

from __future__ import annotations

from omni.wire.protocol import WIRE_VERSION, Buffer, ready_version


def wire_refusal(frame: Buffer, replica_id: str, python: str | None) -> str | None:
    """Why a replica's first message refuses it, or None: a Ready of this version, or
    no Ready at all (a Dead, or garbage, is handled as it always was)."""
    version = ready_version(frame)
    if version is None or version == WIRE_VERSION:
        return None
    theirs = ("0 (an omni from before the handshake said its version)" if version == 0
              else str(version))
    where = f"the environment of {python}" if python else "that replica's environment"
    fix = (f"{python} -m pip install --no-deps --force-reinstall <this server's omni>, or "
           "scripts/make_stage_env.sh again" if python else
           "install the server's omni version where it runs")
    return (f"replica {replica_id} speaks control-plane wire version {theirs}, this server "
            f"speaks {WIRE_VERSION}: refused. Reinstall omni in {where} so both run the same "
            f"omni ({fix})")
