"""π0 served by omni against LeRobot itself (0.4.4, its own environment), for the three
normalisation modes of the state and the actions (MEAN_STD, QUANTILES, MIN_MAX).

For each mode a tiny random π0 is built in LeRobot's release layout
(omni/fixtures/tiny_pi0.py) and served by ``python -m omni.server --policy-seed``; the
unmodified openpi-client sends it LIBERO observations. The reference for each
observation: LeRobot's own pre-processor, loaded from the directory by its
``make_pre_post_processors`` (state normalised, task + "\\n" tokenized), LeRobot's π0
model-side input preparation (PI0Policy._preprocess_images: images to [-1, 1];
prepare_state: zero-padding), transformers' ``PI0ForConditionalGeneration.sample_actions``
on those inputs with the noise the wire seed names (LeRobot's own π0 model needs its
patched transformers; it runs in omni's environment: omni_side.py), the chunk cut to
the action feature as LeRobot's predict_action_chunk cuts it, and LeRobot's own
post-processor un-normalising it. The served chunk must equal it to 1e-4.

Also: LeRobot loads each release and saves it back byte for byte (processor files and
statistics); omni's reading of the statistics equals LeRobot's steps on bare states and
chunks, including a state the normalizer does not list and a mode missing its
statistics; the model-side image preparation of both, where it agrees and where not.

Run: bash scripts/install_lerobot_env.sh &&
     OMNI_PYTHON=$PWD/.venv/bin/python .venv-lerobot/bin/python -m pytest tests/lerobot

Mutations of the adapter, each applied by hand, run and restored (max |served - LeRobot|
in the failures; the tolerance is 1e-4):
- state normalisation inverted (pi0.py _state: ``stats.unnormalize(state)``):
  test_served_actions_equal_lerobots fails for MEAN_STD, QUANTILES and MIN_MAX (0.005,
  0.011, 0.009).
- action un-normalisation removed (pi0.py finish: no ``stats.unnormalize(chunk)``):
  test_served_actions_equal_lerobots fails for all three (2.4, 6.9, 11.1).
- QUANTILES using min/max (lerobot_layout.py NEEDS["QUANTILES"] = ("min", "max")):
  test_served_actions_equal_lerobots[quantiles] (4.2),
  test_statistics_are_applied_as_lerobot_applies_them[quantiles] and
  test_a_mode_without_its_statistics_is_refused_as_in_lerobot fail.
- MIN_MAX formula wrong (lerobot_layout.py Normalizer.normalize: ``(x - lo) / span``
  for MIN_MAX, [0, 1] instead of [-1, 1]): test_served_actions_equal_lerobots[min_max]
  (0.011) and test_statistics_are_applied_as_lerobot_applies_them[min_max] fail.
- the normalizer's ``features`` ignored (lerobot_layout.py _mode): test_a_state_its_
  normalizer_does_not_list_stays_raw_as_in_lerobot fails.
- a mode's missing statistics read as IDENTITY (lerobot_layout.py _normalizer):
  test_a_mode_without_its_statistics_is_refused_as_in_lerobot fails.
- lerobot_layout.py as it was before these tests (a feature's width taken from its first
  statistic, which in LeRobot's files is ``count``, of shape (1,)): the π0 stage dies in
  its warm-up ("the state has 8 values; this policy's statistics have 1"), so every
  served test fails; past that, finish() would have skipped the un-normalisation (action
  statistics of "width 1" against 7 actions).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omni_side import OmniSide
from safetensors.torch import load_file, save_file

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OMNI_PYTHON = os.environ.get("OMNI_PYTHON", str(ROOT / ".venv" / "bin" / "python"))
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
# openpi-client 0.1.2 opens its socket the way websockets >= 14 deprecates (it still works)
pytestmark = pytest.mark.filterwarnings("ignore:connect\\(\\) must be used:DeprecationWarning")
SEED = 11  # --policy-seed: a connection's first call draws its noise from it
VARIANTS = {"MEAN_STD": "pi0", "QUANTILES": "pi0_quantiles", "MIN_MAX": "pi0_min_max"}
PROMPTS = ("pick up the red block", "open the top drawer", "wave")
HUB_TOKENIZER = "google/paligemma-3b-pt-224"  # what the release names
TRANSFORMERS_KEYS = ("vlm_config", "dit_config")  # the tiny shapes, for transformers
NORMALIZER = "policy_preprocessor_step_5_normalizer_processor.safetensors"
UNNORMALIZER = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"

torch.set_num_threads(1)
omni_side: OmniSide  # set for the module's tests by the fixture below


@pytest.fixture(scope="module", autouse=True)
def omni_side_process(tmp_path_factory):
    global omni_side
    omni_side = OmniSide([OMNI_PYTHON, str(HERE / "omni_side.py"), "serve"], ROOT, ENV,
                         tmp_path_factory.mktemp("omni-side") / "stderr.log")
    yield omni_side
    omni_side.close()


@dataclass
class Served:
    mode: str
    model_dir: Path
    port: int


def launch_server(model_dir: Path, log: Path) -> subprocess.Popen:
    command = [OMNI_PYTHON, "-m", "omni.server", "--model", str(model_dir), "--port", "0",
               "--policy-seed", str(SEED)]
    with open(log, "w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=ENV, cwd=ROOT)


def listening_port(server: subprocess.Popen, log: Path) -> int:
    for _ in range(600):
        found = re.search(r"listening on http://[\d.]+:(\d+)", log.read_text())
        if found or server.poll() is not None:
            break
        time.sleep(0.5)
    assert found, f"the server did not start:\n{log.read_text()[-4000:]}"
    return int(found.group(1))


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> dict[str, Path]:
    """A tiny π0 release per mode, built fresh (a cached one may predate the format)."""
    out = {mode: tmp_path_factory.mktemp(v) / "release" for mode, v in VARIANTS.items()}
    for mode, variant in VARIANTS.items():
        omni_side("build", variant, str(out[mode]))
    return out


@pytest.fixture(scope="module")
def servers(releases) -> dict[str, Served]:
    """One server per mode, all started at once: their starts overlap on the cores."""
    logs = {mode: model_dir.parent / "server.log" for mode, model_dir in releases.items()}
    started = {mode: launch_server(releases[mode], logs[mode]) for mode in releases}
    try:
        yield {mode: Served(mode, releases[mode], listening_port(started[mode], logs[mode]))
               for mode in releases}
    finally:
        for server in started.values():  # each stops at once: no robot is left connected
            server.terminate()
            server.wait(30)


@pytest.fixture(params=list(VARIANTS), ids=str.lower)
def served(request, servers) -> Served:
    return servers[request.param]


def lerobot_config(model_dir: Path, tmp_path: Path):
    """LeRobot's PI0Config from the release's config.json, less the two transformers keys
    only the tiny shapes need (LeRobot's loader refuses unknown fields)."""
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies import PI0Config  # noqa: F401  (registers the type "pi0")

    config = json.loads((model_dir / "config.json").read_text())
    for key in TRANSFORMERS_KEYS:
        config.pop(key)
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return PreTrainedConfig.from_pretrained(tmp_path, device="cpu")


def lerobot_processors(config, model_dir: Path):
    """LeRobot's processors as lerobot-eval loads a release's: make_pre_post_processors
    with the directory; offline, its tokenizer step is pointed at the shipped tokenizer."""
    from lerobot.policies.factory import make_pre_post_processors

    tokenizer = {"tokenizer_processor": {"tokenizer_name": str(model_dir / "tokenizer")}}
    return make_pre_post_processors(config, pretrained_path=str(model_dir),
                                    preprocessor_overrides=tokenizer)


def observation(i: int) -> dict:
    """LIBERO's keys, as openpi's LIBERO client sends them; frames at the tiny model's
    image size (56), so that neither side resizes (the *_frames_* tests compare
    resizing)."""
    rng = np.random.default_rng(100 + i)
    return {"observation/image": rng.integers(0, 256, (56, 56, 3), dtype=np.uint8),
            "observation/wrist_image": rng.integers(0, 256, (56, 56, 3), dtype=np.uint8),
            "observation/state": (1.5 * rng.standard_normal(8)).astype(np.float32),
            "prompt": PROMPTS[i % len(PROMPTS)]}


def lerobot_batch(obs: dict) -> dict:
    """The same observation as a LeRobot batch: its feature keys, CHW frames in [0, 1]
    (as its datasets and robots give them), the prompt as ``task``."""
    def frame(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).permute(2, 0, 1).float() / 255.0

    return {"observation.images.image": frame(obs["observation/image"]),
            "observation.images.wrist_image": frame(obs["observation/wrist_image"]),
            "observation.state": torch.from_numpy(obs["observation/state"]),
            "task": obs["prompt"]}


def noise(config) -> torch.Tensor:
    """The noise a wire seed names (docs/robots.md: omni draws it this way)."""
    return torch.randn(1, config.chunk_size, config.max_action_dim,
                       generator=torch.Generator().manual_seed(SEED))


def model_inputs(config, processed: dict) -> dict:
    """LeRobot's PI0Policy input preparation, its own methods on its config (the policy
    itself cannot be built: its model needs LeRobot's patched transformers)."""
    from lerobot.policies.pi0.modeling_pi0 import PI0Policy
    from lerobot.utils.constants import OBS_LANGUAGE_ATTENTION_MASK, OBS_LANGUAGE_TOKENS

    policy_side = SimpleNamespace(config=config, parameters=lambda: iter([torch.zeros(1)]))
    images, _ = PI0Policy._preprocess_images(policy_side, processed)
    return {"pixel_values": torch.stack(images, dim=1),
            "tokens": processed[OBS_LANGUAGE_TOKENS],
            "token_mask": processed[OBS_LANGUAGE_ATTENTION_MASK],
            "state": PI0Policy.prepare_state(policy_side, processed), "noise": noise(config)}


def lerobot_actions(served: Served, tmp_path: Path, observations: list[dict]) -> list:
    config = lerobot_config(served.model_dir, tmp_path)
    assert config.normalization_mapping["STATE"].value == served.mode
    pre, post = lerobot_processors(config, served.model_dir)
    inputs = []
    for obs in observations:
        processed = pre(lerobot_batch(obs))
        # the statistics did something: the state LeRobot feeds the model is not the raw one
        raw = torch.from_numpy(obs["observation/state"])
        assert (processed["observation.state"][0] - raw).abs().max() > 0.1
        inputs.append(model_inputs(config, processed))
    torch.save(inputs, tmp_path / "inputs.pt")
    omni_side("sample", str(served.model_dir), str(tmp_path / "inputs.pt"),
              str(tmp_path / "raw.pt"))
    width = config.output_features["action"].shape[0]
    return [post(raw[:, :, :width])[0].numpy() for raw in torch.load(tmp_path / "raw.pt")]


def served_actions(port: int, obs: dict) -> np.ndarray:
    from openpi_client import websocket_client_policy as wcp

    # a new connection each time: its first call draws its noise from --policy-seed
    policy = wcp.WebsocketClientPolicy(host="127.0.0.1", port=port)
    result = policy.infer(obs)
    policy._ws.close()  # it has no close(): hung up, the server's stop waits on no session
    assert result["seed"] == SEED
    return result["actions"]


@pytest.mark.parametrize("mode", list(VARIANTS), ids=str.lower)
def test_lerobot_loads_the_release_and_saves_it_back_byte_for_byte(releases, mode, tmp_path):
    model_dir = releases[mode]
    config = lerobot_config(model_dir, tmp_path / "config")
    pre, post = lerobot_processors(config, model_dir)
    pre.save_pretrained(tmp_path / "saved")
    post.save_pretrained(tmp_path / "saved")
    for name in ("policy_preprocessor.json", "policy_postprocessor.json"):
        saved = (tmp_path / "saved" / name).read_text()
        saved = saved.replace(json.dumps(str(model_dir / "tokenizer")),
                              json.dumps(HUB_TOKENIZER))  # the one override
        assert saved == (model_dir / name).read_text(), name
    state_files = sorted(p.name for p in model_dir.glob("policy_*.safetensors"))
    assert state_files == sorted(p.name for p in (tmp_path / "saved").glob("*.safetensors"))
    for name in state_files:
        ours, theirs = load_file(model_dir / name), load_file(tmp_path / "saved" / name)
        assert ours.keys() == theirs.keys()
        for key in ours:
            assert torch.equal(ours[key], theirs[key]), key


def test_served_actions_equal_lerobots(served, tmp_path):
    observations = [observation(i) for i in range(3)]
    ours = [served_actions(served.port, obs) for obs in observations]
    # the comparison can fail: the chunk moves over time, and follows the observation
    assert all(a.shape == (50, 7) for a in ours)
    assert np.ptp(ours[0], axis=0).min() > 1e-2
    assert np.abs(ours[0] - ours[1]).max() > 1e-2
    theirs = lerobot_actions(served, tmp_path, observations)
    for i, (mine, reference) in enumerate(zip(ours, theirs, strict=True)):
        np.testing.assert_allclose(mine, reference, rtol=0, atol=1e-4,
                                   err_msg=f"{served.mode}, observation {i}")


def lerobot_normalized(model_dir: Path, tmp_path: Path, states: list, chunks: list):
    """LeRobot's processors on these states (in an observation) and action chunks."""
    config = lerobot_config(model_dir, tmp_path / "config")
    pre, post = lerobot_processors(config, model_dir)
    batches = [{**lerobot_batch(observation(0)), "observation.state": x} for x in states]
    return ([pre(b)["observation.state"][0] for b in batches],
            [post(chunk[None])[0] for chunk in chunks])


def omni_normalized(model_dir: Path, tmp_path: Path, states: list, chunks: list,
                    check: bool = True):
    torch.save({"states": states, "actions": chunks}, tmp_path / "raw.pt")
    error = omni_side("normalize", str(model_dir), str(tmp_path / "raw.pt"),
                      str(tmp_path / "normalized.pt"), check=check)
    if not check:
        return error
    out = torch.load(tmp_path / "normalized.pt")
    return out["states"], out["actions"]


def random_inputs(seed: int = 5) -> tuple[list, list]:
    g = torch.Generator().manual_seed(seed)
    return ([2 * torch.randn(8, generator=g) for _ in range(4)],
            [1.5 * torch.randn(50, 7, generator=g) for _ in range(2)])


@pytest.mark.parametrize("mode", list(VARIANTS), ids=str.lower)
def test_statistics_are_applied_as_lerobot_applies_them(releases, mode, tmp_path):
    """omni's reading of the statistics (lerobot_layout.py) against LeRobot's normalizer
    and unnormalizer steps on the same states and chunks: tighter than through the model."""
    states, chunks = random_inputs()
    theirs = lerobot_normalized(releases[mode], tmp_path, states, chunks)
    ours = omni_normalized(releases[mode], tmp_path, states, chunks)
    for mine, reference, raw in zip(ours[0] + ours[1], theirs[0] + theirs[1],
                                    states + chunks, strict=True):
        assert (reference - raw).abs().max() > 0.1  # LeRobot changed it: the mode acts
        torch.testing.assert_close(mine, reference, rtol=0, atol=1e-5)


def edited_release(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / "edited"
    shutil.copytree(source, target)
    return target


def test_a_state_its_normalizer_does_not_list_stays_raw_as_in_lerobot(releases, tmp_path):
    """LeRobot's normalizer step normalises only the observation features its config lists
    (whatever the norm_map says); the statistics are there, and unused."""
    model_dir = edited_release(releases["QUANTILES"], tmp_path)
    path = model_dir / "policy_preprocessor.json"
    pre = json.loads(path.read_text())
    del pre["steps"][-1]["config"]["features"]["observation.state"]
    path.write_text(json.dumps(pre, indent=2))
    states, chunks = random_inputs()
    theirs = lerobot_normalized(model_dir, tmp_path, states, chunks)
    ours = omni_normalized(model_dir, tmp_path, states, chunks)
    for mine, reference, raw in zip(ours[0], theirs[0], states, strict=True):
        assert torch.equal(reference, raw) and torch.equal(mine, raw)


def test_a_mode_without_its_statistics_is_refused_as_in_lerobot(releases, tmp_path):
    """QUANTILES with no q01 / q99 in the state file: LeRobot raises at the first
    observation, omni refuses the release at load (never serving a raw state)."""
    model_dir = edited_release(releases["QUANTILES"], tmp_path)
    for name in (NORMALIZER, UNNORMALIZER):
        stats = load_file(model_dir / name)
        save_file({k: v for k, v in stats.items()
                   if k not in ("observation.state.q01", "observation.state.q99")},
                  model_dir / name)
    states, chunks = random_inputs()
    with pytest.raises(ValueError, match="QUANTILES normalization mode requires q01"):
        lerobot_normalized(model_dir, tmp_path, states, chunks)
    error = omni_normalized(model_dir, tmp_path, states, chunks, check=False)
    assert error and "has no observation.state.q01, observation.state.q99 for QUANTILES" in error


def prepared_frames(sizes: list[tuple[int, int]], tmp_path: Path, side: int = 224):
    """(LeRobot's, omni's) model input of one smooth uint8 frame of each (H, W) for a model
    of side x side: LeRobot's PI0Policy._preprocess_images on the frame in [0, 1] (as its
    batches hold frames) and omni's resize_pad (policy_images.py) on the uint8 frame."""
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.pi0.configuration_pi0 import PI0Config
    from lerobot.policies.pi0.modeling_pi0 import PI0Policy

    frames = []
    for h, w in sizes:
        y, x = np.mgrid[0:h, 0:w] / max(h, w)
        picture = np.stack([np.sin(6 * x + 3 * y + c) for c in range(3)]) * 127.5 + 127.5
        frames.append(torch.from_numpy(picture.round().astype(np.uint8)))
    torch.save(frames, tmp_path / "frames.pt")
    omni_side("resize", str(side), str(tmp_path / "frames.pt"), str(tmp_path / "ours.pt"))
    theirs = []
    for frame in frames:
        camera = {"observation.images.image": PolicyFeature(FeatureType.VISUAL, frame.shape)}
        config = PI0Config(input_features=camera, image_resolution=(side, side), device="cpu",
                           output_features={"action": PolicyFeature(FeatureType.ACTION, (7,))})
        policy_side = SimpleNamespace(config=config, parameters=lambda: iter([torch.zeros(1)]))
        batch = {"observation.images.image": (frame.float() / 255.0)[None]}
        theirs.append(PI0Policy._preprocess_images(policy_side, batch)[0][0][0])
    return theirs, torch.load(tmp_path / "ours.pt")


def test_square_frames_are_prepared_as_lerobot_prepares_them(tmp_path):
    """At the model's size both give the frame in [-1, 1], exactly. Resized, LeRobot
    interpolates the [0, 1] floats bilinearly; omni (transformers' PI0ImageProcessor)
    the uint8 pixels bicubically, antialiased: a smooth picture agrees to about one uint8
    level (uniform noise at 256 -> 224 differs by up to 0.34)."""
    (same, theirs), (ours_same, ours) = prepared_frames([(224, 224), (256, 256)], tmp_path)
    torch.testing.assert_close(ours_same, same, rtol=0, atol=1e-6)
    assert (ours - theirs).abs().max() <= 2 / 255 + 1e-6  # one uint8 level


def test_non_square_frames_are_padded_unlike_lerobot(tmp_path):
    """A known disagreement, reported rather than changed (omni follows transformers'
    PI0ImageProcessor). A 480 x 640 frame fits into 168 x 224 on both sides, but LeRobot
    0.4.4's resize_with_pad_torch centres it and pads with -1.0 on the [0, 1] frame, which
    its ``* 2 - 1`` then makes -3.0 (outside SigLIP's [-1, 1]: openpi pads frames that
    are already in [-1, 1], where -1.0 is black); omni puts the picture at the top left and
    pads with 0.0 after normalising. The pictures themselves agree as in the square case."""
    (theirs,), (ours,) = prepared_frames([(480, 640)], tmp_path)
    assert (theirs[:, :28] == -3.0).all() and (theirs[:, -28:] == -3.0).all()
    assert (ours[:, 168:] == 0.0).all()
    assert (ours[:, :168] - theirs[:, 28:-28]).abs().max() <= 2 / 255 + 1e-6  # one uint8 level

