"""Every engine refuses options it does not read (omni/engines/base.py check_options): a
typo in a stage's options fails its load with the valid names, instead of being ignored.
The model engines' own cases are in their tests (ar, generation, diffusion)."""

from __future__ import annotations

import pytest

from omni.engines.base import EngineLoadError, check_options
from omni.engines.echo import EchoEngine


def test_check_options_names_the_unknown_and_the_valid_ones():
    check_options("x engine", {"a": 1, "nice": 0, "payload_arena_mb": 64}, {"a", "b"})
    check_options("x engine", None, {"a"})
    with pytest.raises(EngineLoadError, match=r"unknown x engine option\(s\) c, d; the options "
                                              r"are a, b, nice, payload_arena_mb$"):
        check_options("x engine", {"d": 1, "a": 2, "c": 3}, {"a", "b"})


def test_echo_engine_refuses_an_unknown_option():
    with pytest.raises(EngineLoadError, match=r"echo engine \(stage 's'\) option\(s\) chunk;"):
        EchoEngine("s", {"chunk": 2})
    assert EchoEngine("s", {"chunks": 2, "delay_ms": 1}).chunks == 2
