"""media_params.engine_params: what the image and video endpoints forward to the diffusion
stage, checked against the limits (and abilities) the stage reported in READY."""

from __future__ import annotations

import pytest

from omni.api.errors import APIError
from omni.api.media_params import engine_params
from omni.models.diffusion_limits import Limits

TWO_EXPERTS = {"pipeline": "WanPipeline", "guidance_scale_2": True, **Limits().info()}
ONE_EXPERT = {"pipeline": "LTXPipeline", "guidance_scale_2": False, **Limits().info()}


def test_guidance_scale_2_is_forwarded_to_a_two_expert_stage():
    params = engine_params({"guidance_scale": 4, "guidance_scale_2": 3}, TWO_EXPERTS)
    assert params == {"guidance_scale": 4.0, "guidance_scale_2": 3.0}
    assert engine_params({"guidance_scale": 4}, TWO_EXPERTS) == {"guidance_scale": 4.0}


@pytest.mark.parametrize("info, value, text", [
    (ONE_EXPERT, 3.0, "second (low-noise) expert; LTXPipeline"),
    ({"pipeline": "X", **Limits().info()}, 3.0, "second (low-noise) expert"),
    (TWO_EXPERTS, 51.0, "'guidance_scale_2' must be a number from 0 to 50"),
    (TWO_EXPERTS, -1.0, "'guidance_scale_2' must be a number from 0 to 50")])
def test_bad_guidance_scale_2_is_a_400_naming_it(info, value, text):
    with pytest.raises(APIError) as caught:
        engine_params({"guidance_scale_2": value}, info)
    assert caught.value.status == 400 and caught.value.param == "guidance_scale_2"
    assert text in caught.value.message
