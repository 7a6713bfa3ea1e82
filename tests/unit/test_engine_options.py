"""Every engine refuses options it does not read (omni/engines/base.py check_options): a
typo in a stage's options fails its load with the valid names, instead of being ignored.
The model engines' own cases are in their tests (ar, generation, diffusion)."""

from __future__ import annotations

import pytest

from omni.engines.base import EngineLoadError, check_options
from omni.engines.echo.engine import EchoEngine


def test_check_options_names_the_unknown_and_the_valid_ones():
    check_options("x engine", {"a": 1, "nice": 0, "payload_arena_mb": 64}, {"a", "b"})
    check_options("x engine", None, {"a"})
    with pytest.raises(EngineLoadError, match=r"unknown x engine option\(s\) c, d; the options "
                                              r"are a, b, gc_freeze, nice, payload_arena_mb$"):
        check_options("x engine", {"d": 1, "a": 2, "c": 3}, {"a", "b"})


def test_echo_engine_refuses_an_unknown_option():
    with pytest.raises(EngineLoadError, match=r"echo engine \(stage 's'\) option\(s\) chunk;"):
        EchoEngine("s", {"chunk": 2})
    assert EchoEngine("s", {"chunks": 2, "delay_ms": 1}).chunks == 2


@pytest.mark.parametrize("kind, model, typo", [("generation", "qwen3_omni_code2wav", "chunk_frame"),
                                              ("generation", "piper", "max_phoneme"),
                                              ("diffusion", "wan", "max_batch_row")])
def test_an_unknown_adapter_option_fails_before_any_weights_load(tmp_path, kind, model, typo):
    from omni.engines.diffusion.engine import build_diffusion_engine
    from omni.engines.generation.build import build_generation_engine

    build = build_generation_engine if kind == "generation" else build_diffusion_engine
    missing = str(tmp_path / "no-such-model")  # loading would fail on this directory
    with pytest.raises(EngineLoadError, match=rf"unknown {kind} engine \({model}\) "
                                              rf"option\(s\) {typo};"):
        build(model, model_dir=missing, device="cpu", dtype="auto", options={typo: 1})


def test_every_adapter_declares_its_options():
    from omni.models import DIFFUSION_DENOISERS, GENERATION_RUNNERS, adapter_options

    for model in [*GENERATION_RUNNERS, *DIFFUSION_DENOISERS]:
        assert adapter_options(model), model
    assert adapter_options("no-such-model") == frozenset()
    # feedback AR models with options of their own: the AR engine adds them to its own
    for model in ("qwen3_omni_talker", "qwen3_tts_ar_talker"):
        assert "predictor_compile" in adapter_options(model), model
