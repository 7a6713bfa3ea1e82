"""A stage's own Python environment: `python:` (an interpreter) or `env:` (a named one).

Model code does not agree on its libraries: a backend or a family's own package may pin
library versions other than the server's (docs/models.md lists them). A stage whose code needs
other versions names the interpreter of an environment that has them, and the launcher
starts its replicas with it (omni/runtime/env_process.py) instead of forking them from the
server. Named environments live in one directory, ENVS_DIR: `$OMNI_ENVS_DIR`, else
~/.cache/omni/envs; `env: NAME` is `ENVS_DIR/NAME/bin/python`, as
scripts/make_stage_env.sh NAME REQUIREMENTS_FILE makes it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from omni.config.checks import ConfigError, as_str

ENV_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
DEFAULT_ENVS_DIR = "~/.cache/omni/envs"


def envs_dir() -> str:
    """Where named environments live: $OMNI_ENVS_DIR, else ~/.cache/omni/envs."""
    return os.path.expanduser(os.environ.get("OMNI_ENVS_DIR") or DEFAULT_ENVS_DIR)


def env_python(name: str) -> str:
    """The interpreter of the named environment `name`."""
    return os.path.join(envs_dir(), name, "bin", "python")


def make_env_hint(name: str = "NAME") -> str:
    return (f"Make it with `scripts/make_stage_env.sh {name} REQUIREMENTS_FILE` (it goes to "
            f"{os.path.join(envs_dir(), name)}; $OMNI_ENVS_DIR moves the directory of named "
            "environments), see docs/pipeline.md")


def stage_python(src: str, path: str, raw: Mapping[str, Any], base_dir: str | None,
                 remote: bool = False) -> str | None:
    """The interpreter a stage's replicas run with, or None for the server's own (they
    are forked from its fork server); ``remote``: the stage is placed by Ray. Checked here, so that a missing environment fails
    the file before any engine starts, saying how to make it."""
    python, env = raw.get("python"), raw.get("env")
    if python is None and env is None:
        return None
    field = f"{path}.python" if python is not None else f"{path}.env"
    if python is not None and env is not None:
        raise ConfigError(src, field, "a stage names its environment once",
                          "Keep either python: or env:")
    if raw.get("launch", "local") != "local" or remote:
        raise ConfigError(src, field, "only replicas this server starts on its host run "
                          "in an environment it names (an external or Ray-placed replica "
                          "runs with the interpreter that starts it)",
                          "Remove launch/placement, or start the replica with that "
                          "environment's python -m omni.engines.proc")
    if env is not None:
        return _named(src, field, env)
    return _interpreter(src, field, python, base_dir)


def _named(src: str, field: str, value: object) -> str:
    name = as_str(src, field, value)
    if not ENV_NAME.fullmatch(name):
        raise ConfigError(src, field, f"bad environment name {name!r}",
                          "Use letters, digits, '.', '_' and '-'; a path goes in python:")
    python = env_python(name)
    if not _executable(python):
        raise ConfigError(src, field, f"no environment {name!r}: {python} does not exist",
                          make_env_hint(name))
    return python


def _interpreter(src: str, field: str, value: object, base_dir: str | None) -> str:
    expanded = os.path.expanduser(as_str(src, field, value))
    # not resolved: a venv's bin/python is a link to the base interpreter, and only
    # started through the link does it run with the venv's site-packages
    python = os.path.abspath(os.path.join(base_dir or os.getcwd(), expanded))
    if not _executable(python):
        raise ConfigError(src, field, f"{python} is not an executable file",
                          "Name a virtual environment's bin/python (one with omni's engine "
                          "side and the model's libraries). " + make_env_hint())
    return python


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)
