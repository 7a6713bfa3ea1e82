"""What a launch leaves on the host, found by name, and swept when its creator is dead.

A launch's private control directory is ``$TMPDIR/omni-ipc-<server pid>-<random>`` and its
payload arenas are ``/dev/shm/omni-<server pid>-<tag>-...``. A server stopped normally or
by SIGTERM removes both; one killed with SIGKILL cannot, so the next launch on the host
removes those whose server pid no longer runs.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import tempfile

log = logging.getLogger("omni.runtime.leftovers")

IPC_DIR_PREFIX = "omni-ipc-"
SHM_DIR = "/dev/shm"
_OWNER = re.compile(r"^omni-(?:ipc-)?(\d+)-")


def new_ipc_dir() -> str:
    """A private (0700) directory for this launch's ipc:// endpoints."""
    return tempfile.mkdtemp(prefix=f"{IPC_DIR_PREFIX}{os.getpid()}-")


def unlink_arenas(prefix: str, shm_dir: str = SHM_DIR) -> list[str]:
    """Remove shared-memory arenas by name prefix (their producer is gone).

    Plain unlinks, not omni.connector.cleanup_stale: the orchestrator process must not
    import torch for this. Processes that still map an arena keep their mapping.
    """
    removed = []
    for path in glob.glob(os.path.join(shm_dir, glob.escape(prefix) + "*")):
        try:
            os.unlink(path)
            removed.append(os.path.basename(path))
        except FileNotFoundError:
            pass
    return removed


def sweep_dead_launches(tmp_dir: str | None = None, shm_dir: str = SHM_DIR) -> list[str]:
    """Remove control directories and arenas of launches whose server pid is dead."""
    removed = []
    for directory, is_dir in ((tmp_dir or tempfile.gettempdir(), True), (shm_dir, False)):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            match = _OWNER.match(name)
            if not match or (name.startswith(IPC_DIR_PREFIX) != is_dir) or _alive(int(match[1])):
                continue
            path = os.path.join(directory, name)
            try:
                shutil.rmtree(path) if is_dir else os.unlink(path)
                removed.append(path)
            except OSError:
                continue  # another user's, or gone already
    if removed:
        log.info("removed %d leftovers of launches whose server is gone: %s", len(removed),
                 ", ".join(removed[:5]) + (" ..." if len(removed) > 5 else ""))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
