"""A replica started with another Python interpreter: a stage in its own environment.

A stage that names its environment (`python:` / `env:`, omni/config/environments.py)
cannot be forked from the server's fork server, which holds the server's interpreter and
libraries. Its replicas are `subprocess` children of that interpreter running the engine
process's entry point (omni/engines/proc/bootstrap.py, then `python -m omni.engines.proc
--spec-stdin`) with the spec the launcher builds for every replica, written to the
child's stdin as msgpack (omni/engines/proc/stdin.py). The pipe stays open: its end of
file tells the child that the server is gone, even after a SIGKILL, so no engine
outlives its server.

EnvProcess stands in for the multiprocessing.Process the launcher watches: `sentinel` (a
pidfd, readable once the child has exited: the event loop watches it like any other
sentinel), `pid`, `exitcode` (negative: the signal that ended it), `kill()`,
`terminate()`, `join()`, `is_alive()`, and `describe()` for the exit's log line.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from pathlib import Path

from omni.engines.proc.spec import EngineSpec, spec_bytes
from omni.engines.proc.stdin import frame

log = logging.getLogger("omni.runtime.launcher")

OMNI_PACKAGE = Path(__file__).resolve().parents[1]  # the server's omni
BOOTSTRAP = str(OMNI_PACKAGE / "engines" / "proc" / "bootstrap.py")
MAKE_ENV = "scripts/make_stage_env.sh NAME REQUIREMENTS_FILE (docs/pipeline.md)"


def omni_path(directory: str) -> str:
    """A directory that holds only the server's omni package (a link to it), made once
    in ``directory`` (the launch's private directory, removed at teardown): what an
    environment without omni of its own gets on its path. Not omni's parent directory,
    which may be the server's site-packages: the environment would then import the
    server's builds of whatever it lacks, for another interpreter perhaps."""
    path = os.path.join(directory, "omni-path")
    link = os.path.join(path, "omni")
    if not os.path.islink(link):
        os.makedirs(path, exist_ok=True)
        os.symlink(OMNI_PACKAGE, link)
    return path


def child_environment(python: str) -> dict[str, str]:
    """The server's environment variables, as a forked engine has them, with the
    interpreter's virtual environment active: tools that an engine's libraries start by
    name (compilers of torch.compile, ninja, ...) are found there first."""
    env = dict(os.environ)
    env.pop("PYTHONHOME", None)  # would point the interpreter at another installation
    venv = Path(python).parent.parent
    if (venv / "pyvenv.cfg").is_file():
        env["VIRTUAL_ENV"] = str(venv)
        env["PATH"] = os.pathsep.join(p for p in (str(venv / "bin"), env.get("PATH")) if p)
    return env


class EnvProcess:
    """One replica's engine under the stage's own interpreter (module doc)."""

    def __init__(self, python: str, spec: EngineSpec, name: str, path_dir: str) -> None:
        """Start it; OSError when the interpreter cannot be started at all."""
        self.python, self.name = python, name
        self._popen = subprocess.Popen(
            [python, BOOTSTRAP, path_dir, spec.replica_id], stdin=subprocess.PIPE,
            env=child_environment(python), close_fds=True)
        self.pid = self._popen.pid
        try:  # our child, not reaped before we wait: the pid cannot name another process yet
            self.sentinel = os.pidfd_open(self.pid)
        except OSError:  # no pidfd (too many open files): nothing may outlive the failure
            self._popen.kill()
            self._popen.wait()
            self._popen.stdin.close()
            raise
        try:
            self._popen.stdin.write(frame(spec_bytes(spec)))
            self._popen.stdin.flush()
        except OSError as exc:  # it died at once; its sentinel says how
            log.debug("writing the spec of %s: %s", name, exc)

    @property
    def exitcode(self) -> int | None:
        return self._popen.poll()

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def kill(self) -> None:
        self._popen.kill()  # a no-op once it was reaped

    def terminate(self) -> None:
        self._popen.terminate()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the exit, then close the pidfd and our end of its stdin."""
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return
        if self.sentinel >= 0:
            os.close(self.sentinel)
            self.sentinel = -1
            self._popen.stdin.close()

    def describe(self, connected: bool = True) -> str:
        code = self._popen.poll()
        where = f"process {self.pid} ({self.python})"
        if code is None:
            return f"{where} still running but unreachable"
        if code < 0:
            return f"{where} killed by {signal.Signals(-code).name}"
        reason = f"{where} exited with code {code}"
        if code and not connected:  # it never reached the control plane: its import failed
            reason += (" before connecting (its error is on stderr): an environment whose "
                       "omni cannot import, or lacks the model's libraries, ends there; "
                       f"build one with {MAKE_ENV}")
        return reason
