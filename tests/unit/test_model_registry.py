"""Models are looked up by the stage's `model` name, with errors that help, and built by
keyword only."""

from __future__ import annotations

import inspect

import pytest

from omni.engines.base import EngineLoadError
from omni.engines.diffusion.engine import build_diffusion_engine
from omni.engines.generation.build import build_generation_engine
from omni.engines.policy.engine import build_policy_engine
from omni.models import (
    AR_FEEDBACK_MODELS,
    DIFFUSION_DENOISERS,
    GENERATION_RUNNERS,
    POLICIES,
    build_denoiser,
    build_feedback_lm,
    build_policy,
    build_runner,
)


def test_unknown_model_names_the_known_ones():
    with pytest.raises(EngineLoadError) as info:
        build_runner("nope", model_dir=None, device="cpu", dtype="auto", options={})
    for name in GENERATION_RUNNERS:
        assert name in str(info.value)


def test_a_model_that_needs_a_directory_says_so():
    with pytest.raises(EngineLoadError, match="needs a model_dir"):
        build_runner("qwen3_omni_code2wav", model_dir=None, device="cpu", dtype="auto", options={})


ADAPTER_REGISTRIES = {"GENERATION_RUNNERS": GENERATION_RUNNERS,
                      "DIFFUSION_DENOISERS": DIFFUSION_DENOISERS, "POLICIES": POLICIES,
                      "AR_FEEDBACK_MODELS": AR_FEEDBACK_MODELS}
BUILDERS = [build_runner, build_denoiser, build_policy, build_feedback_lm,
            build_generation_engine, build_diffusion_engine, build_policy_engine]


@pytest.mark.parametrize("registry", ADAPTER_REGISTRIES)
def test_every_adapter_builds_with_the_one_keyword_only_signature(registry):
    for model, builder in ADAPTER_REGISTRIES[registry].items():
        params = inspect.signature(builder).parameters.values()
        assert [(p.name, p.kind) for p in params] == [
            (name, inspect.Parameter.KEYWORD_ONLY)
            for name in ("model_dir", "device", "dtype", "options")], f"{registry}[{model}]"


@pytest.mark.parametrize("builder", BUILDERS, ids=lambda b: b.__name__)
def test_device_and_dtype_cannot_be_passed_by_position(builder):
    # a swapped device and dtype (both strings) would otherwise load on the wrong one
    with pytest.raises(TypeError, match="positional"):
        builder("whisper", None, "cpu", "auto", {})
