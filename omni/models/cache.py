"""The model cache: directories built once (converted weights, tiny fixtures), atomically.

A build goes to a temp dir next to its target and is renamed into place, so a reader never
sees a half-written directory and concurrent builders do not corrupt each other (the first
rename wins; the loser's copy is discarded). A stale or partial target is moved aside.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def default_cache_dir() -> Path:
    """`$OMNI_CACHE_DIR`, else ~/.cache/omni/models."""
    env = os.environ.get("OMNI_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "omni" / "models"


def build_once(target: Path, is_complete: Callable[[Path], bool],
               build: Callable[[Path], None]) -> Path:
    """`target` if `is_complete(target)`, else `build(tmp)` renamed into place."""
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.building-", dir=target.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700; the final dir should look like any other
        build(tmp)
        if not is_complete(tmp):
            raise RuntimeError(f"building {target.name} left an incomplete directory")
        _rename_into_place(tmp, target, is_complete)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _rename_into_place(tmp: Path, target: Path, is_complete: Callable[[Path], bool]) -> None:
    try:
        os.rename(tmp, target)  # atomic; fails if target is a non-empty dir
        return
    except OSError:
        if is_complete(target):  # a concurrent builder won
            return
    stale = Path(tempfile.mkdtemp(prefix=f".{target.name}.stale-", dir=target.parent))
    try:
        os.rename(target, stale / target.name)
    except OSError:
        pass  # someone else moved it
    shutil.rmtree(stale, ignore_errors=True)
    try:
        os.rename(tmp, target)
    except OSError:
        if not is_complete(target):
            raise
