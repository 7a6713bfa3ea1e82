"""Generation models are looked up by the stage's `model` name, with errors that help."""

from __future__ import annotations

import pytest

from omni.engines.base import EngineLoadError
from omni.models import GENERATION_RUNNERS, build_runner


def test_unknown_model_names_the_known_ones():
    with pytest.raises(EngineLoadError) as info:
        build_runner("nope", model_dir=None, device="cpu", dtype="auto", options={})
    for name in GENERATION_RUNNERS:
        assert name in str(info.value)


def test_a_model_that_needs_a_directory_says_so():
    with pytest.raises(EngineLoadError, match="needs a model_dir"):
        build_runner("qwen3_omni_code2wav", model_dir=None, device="cpu", dtype="auto", options={})
