"""A policy's declared inputs read from robots' observations (omni/models/policy_inputs.py):
each key style places the same robot's cameras and state, the stage options fix a
mapping, and whatever the mapping cannot place is refused naming its key."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omni.engines.base import EngineLoadError
from omni.models.policy_inputs import ObservationLayout

FEATURES = ("observation.images.base", "observation.images.wrist")


def frame(seed: int, shape=(32, 48, 3)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def layout(options=None, features=FEATURES, width=8, **kw) -> ObservationLayout:
    return ObservationLayout.declare(features, width, options or {}, **kw)


def read_frames(obs, lay=None):
    read = (lay or layout()).read(obs)
    return [key for key, _ in read.cameras], [f for _, f in read.cameras], read.state


def test_each_key_style_places_the_same_robot():
    a, b, state = frame(1), frame(2), np.arange(8, dtype=np.float32)
    styles = {
        "lerobot": {FEATURES[0]: a, FEATURES[1]: b, "observation.state": state},
        "libero": {"observation/image": a, "observation/wrist_image": b,
                   "observation/state": state},
        "droid": {"observation/exterior_image_1_left": a, "observation/wrist_image_left": b,
                  "observation/joint_position": state[:7],
                  "observation/gripper_position": state[7:]},
        "nested lerobot": {"observation": {"images": {"base": a, "wrist": b},
                                           "state": state}},
    }
    for name, obs in styles.items():
        _, frames, got_state = read_frames({**obs, "prompt": "p"})
        assert torch.equal(frames[0].permute(1, 2, 0), torch.from_numpy(a)), name
        assert torch.equal(frames[1].permute(1, 2, 0), torch.from_numpy(b)), name
        assert np.array_equal(got_state, state), name


def test_aloha_nests_its_cameras_and_needs_four():
    four = ObservationLayout.declare(("c0", "c1", "c2", "c3"), 14, {})
    obs = {"images": {n: frame(i) for i, n in enumerate(
        ("cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist"))},
        "state": np.zeros(14), "prompt": "fold"}
    keys, _, _ = read_frames(obs, four)
    assert keys == ["images.cam_high", "images.cam_low", "images.cam_left_wrist",
                    "images.cam_right_wrist"]
    with pytest.raises(ValueError, match="none of this policy's cameras"):
        layout().read(obs)  # a two-camera policy never takes two of ALOHA's four


@pytest.mark.parametrize("change, message", [
    ({"observation/image": "not an image"}, "camera 'observation/image' must be an image"),
    ({"observation/image": None}, "camera 'observation/image' must be an image array"),
    ({"observation/wrist_image": np.zeros((4, 4), np.uint8)},
     "camera 'observation/wrist_image' must be an image array (H, W, 3) or (3, H, W), got "
     "shape (4, 4)"),
    ({"observation/image": np.full((4, 4, 3), np.nan, np.float32)},
     "camera 'observation/image' holds NaN"),
    ({"observation/image": np.full((4, 4, 3), 255.0)}, "float frames must be in [0, 1]"),
    ({"observation/state": np.zeros(7)},
     "the state 'observation/state' has 7 values; this policy's robot has 8"),
    ({"observation/state": np.zeros((2, 4))}, "'observation/state' must be a 1-D array"),
    ({"observation/state": [1.0, float("inf")] + [0.0] * 6},
     "'observation/state' holds NaN or infinity"),
    ({"observation/third_image": frame(3)}, "key 'observation/third_image' is not one"),
    ({"observation/image_flipped": frame(3)}, "key 'observation/image_flipped' is not one"),
    ({"images": {"cam_high": frame(3)}}, "key 'images.cam_high' is not one"),
])
def test_a_malformed_libero_observation_is_refused_naming_the_key(change, message):
    obs = {"observation/image": frame(1), "observation/wrist_image": frame(2),
           "observation/state": np.zeros(8), "prompt": "p", **change}
    with pytest.raises(ValueError) as info:
        layout().read(obs)
    assert message in str(info.value)


@pytest.mark.parametrize("missing", ["observation/image", "observation/wrist_image",
                                     "observation/state"])
def test_a_missing_declared_input_is_named(missing):
    obs = {"observation/image": frame(1), "observation/wrist_image": frame(2),
           "observation/state": np.zeros(8)}
    del obs[missing]
    with pytest.raises(ValueError, match=f"no '{missing}'"):
        layout().read(obs)


def test_the_stage_options_fix_the_mapping():
    lay = layout({"cameras": ["front", "arm.cam"], "state_keys": ["joints", "grip"]})
    obs = {"front": frame(1), "arm": {"cam": frame(2)}, "joints": np.zeros(6),
           "grip": [0.5, 0.5], "prompt": "p"}
    keys, _, state = read_frames(obs, lay)
    assert keys == ["front", "arm.cam"] and state.tolist() == [0] * 6 + [0.5, 0.5]
    libero = {"observation/image": frame(1), "observation/wrist_image": frame(2),
              "observation/state": np.zeros(8)}
    with pytest.raises(ValueError, match="options keys: front, arm.cam, joints, grip"):
        lay.read(libero)  # a fixed mapping tries no other style
    only_droid = layout({"observation_keys": "droid"})
    with pytest.raises(ValueError, match="droid keys"):
        only_droid.read(libero)


@pytest.mark.parametrize("options, features, message", [
    ({"observation_keys": "ur5"}, FEATURES, "not a key style"),
    ({"cameras": ["only_one"]}, FEATURES, "1 camera keys (only_one) for a policy of 2"),
    ({"observation_keys": "aloha"}, FEATURES, "4 camera keys"),
    ({"cameras": [3, 4]}, FEATURES, "lists of observation keys"),
    ({}, (), "declares no cameras"),
])
def test_a_mapping_that_cannot_fit_fails_the_load(options, features, message):
    with pytest.raises(EngineLoadError) as info:
        layout(options, features)
    assert message in str(info.value)


def test_a_frames_only_policy_takes_its_style_s_first_camera_and_says_what_it_skips():
    lay = ObservationLayout.declare(("observation.image",), None, {},
                                    other_keys=frozenset({"prompt", "domain"}),
                                    reads_state=False, spare_cameras=True)
    droid = {"observation/exterior_image_1_left": frame(1),
             "observation/wrist_image_left": frame(2), "observation/joint_position":
             np.zeros(7), "observation/gripper_position": np.zeros(1), "domain": "droid"}
    read = lay.read(droid)
    assert [k for k, _ in read.cameras] == ["observation/exterior_image_1_left"]
    assert read.state is None and read.values == {"domain": "droid"}
    described = lay.describe()["key_styles"]["droid"]
    assert described["unused"] == ["observation/wrist_image_left",
                                   "observation/joint_position",
                                   "observation/gripper_position"]


def test_the_metadata_lists_the_inputs_and_every_style_that_fits():
    described = layout().describe()
    assert described["cameras"] == list(FEATURES) and described["state_width"] == 8
    assert set(described["key_styles"]) == {"lerobot", "libero", "droid"}
    assert described["key_styles"]["libero"]["cameras"] == {
        "observation/image": FEATURES[0], "observation/wrist_image": FEATURES[1]}


def test_a_blank_observation_reads_back():
    lay = layout({"observation_keys": "droid"})
    read = lay.read({**lay.blank(16), "prompt": ""})
    assert len(read.cameras) == 2 and read.state.shape == (8,)
