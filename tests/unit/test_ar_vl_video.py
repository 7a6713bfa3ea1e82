"""Video input of Qwen2.5-VL and Qwen3-VL through the AR engine (tiny random release-layout
checkpoints): prompts with videos, alone, after an image and twice, batched with a text
request, decode greedily to exactly what transformers' own ``generate`` gives for the same
processor inputs (tests/unit/vl_reference.py makes them with transformers' own reader,
sampler, patchify and timestamps where those run without torchvision); the tower runs
once for every image and video that waits; bad videos fail their own request only, and
videos beyond the context are refused from their headers."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import pytest
import torch
from unit.test_ar_vl import run
from unit.vl_reference import GREEDY, QUESTION, mp4, png, video_reference

from omni.engines.ar.engine import AREngine
from omni.engines.base import EngineRequest
from omni.fixtures.tiny_models import ensure_tiny_model
from omni.media.video import encode_mp4
from omni.models import qwen_vl_video

torch.set_num_threads(1)
VIDEOS = {"one": mp4(1), "other": mp4(2)}


def video_request(rid: str, parts: list[tuple[str, bytes]]) -> EngineRequest:
    content = [{"type": kind, kind: {"data": data}} for kind, data in parts]
    messages = [{"role": "user", "content": content + [{"type": "text", "text": QUESTION}]}]
    return EngineRequest(rid, {"messages": messages}, dict(GREEDY))


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def vl_dir(request, tmp_path_factory) -> str:
    return str(ensure_tiny_model(request.param, tmp_path_factory.getbasetemp() / "models"))


def test_video_chat_matches_transformers_generate(vl_dir):
    engine = AREngine(vl_dir)
    assert engine.info()["input_parts"] == ["text", "image_url", "video_url"]
    model = engine.lm.media.model
    tower = model.get_image_features
    calls: list[int] = []  # items per tower call
    model.get_image_features = lambda pixels, grid, **kw: calls.append(len(grid)) or tower(
        pixels, grid, **kw)
    image = png(64, 48, 1)
    requests = [video_request(rid, [("video", data)]) for rid, data in VIDEOS.items()]
    requests += [video_request("mixed", [("image", image), ("video", VIDEOS["one"])]),
                 video_request("twice", [("video", VIDEOS["other"])] * 2),
                 EngineRequest("text", {"prompt": "Hello"}, dict(GREEDY))]
    got, errors = run(engine, requests)
    assert not errors and set(got) == {*VIDEOS, "mixed", "twice", "text"}
    # the fixture varies: several tokens per answer, and another video, another answer
    assert len(set(got["one"])) >= 4 and got["one"] != got["other"]
    assert calls == [3]  # one tower call over the 2 distinct videos and the image
    for rid, data in VIDEOS.items():
        assert got[rid] == video_reference(vl_dir, data, GREEDY["max_tokens"]), rid
    assert got["mixed"] == video_reference(vl_dir, VIDEOS["one"], GREEDY["max_tokens"],
                                           image=image)
    assert engine.stats()["kv_blocks_used"] == 0


def test_bad_videos_fail_their_request_alone(vl_dir):
    engine = AREngine(vl_dir)
    one_frame = encode_mp4(torch.zeros(1, 48, 64, 3, dtype=torch.uint8).numpy(), 10)
    got, errors = run(engine, [video_request("junk", [("video", b"not a video")]),
                               video_request("short", [("video", one_frame)]),
                               video_request("good", [("video", VIDEOS["one"])])])
    assert "messages[0].content[0]: not a video this server can read" in errors["junk"]
    assert "messages[0].content[0]: the video has 1 frame(s); at least 2 are needed" \
        in errors["short"]
    assert "good" not in errors and len(got["good"]) == GREEDY["max_tokens"]


def test_videos_beyond_the_context_are_refused_before_decoding(vl_dir, monkeypatch):
    engine = AREngine(vl_dir)
    per_video = qwen_vl_video.token_count(engine.lm.media.video, VIDEOS["one"])
    assert per_video > 0
    engine.lm.media.max_image_tokens = 2 * per_video
    monkeypatch.setattr(qwen_vl_video, "decode", lambda *a: pytest.fail("decoded"))
    _, errors = run(engine, [video_request("many", [("video", VIDEOS["one"])] * 3)])
    assert f"take {3 * per_video} tokens; the model's context holds" in errors["many"]


@pytest.mark.parametrize("total,fps", [(20, 10.0), (3, 30.0), (5000, 25.0), (61, 29.97)])
def test_qwen3_vl_frames_and_times_are_its_processors(total, fps):
    """Qwen3-VL's sampler and timestamps are transformers' own code, which imports
    without torchvision: ours pick the same frames and times."""
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_utils import VideoMetadata

    rules = qwen_vl_video.VideoRules(
        "qwen3_vl", fps=2.0, min_frames=4, max_frames=768, min_pixels=1, max_pixels=1,
        patch=16, merge=2, temporal=2, mean=(0.5,) * 3, std=(0.5,) * 3, rescale=1 / 255)
    theirs = partial(Qwen3VLVideoProcessor.sample_frames,
                     SimpleNamespace(fps=2.0, min_frames=4, max_frames=768))(
        VideoMetadata(total_num_frames=total, fps=fps)).tolist()
    ours = qwen_vl_video.sample_indices(rules, total, fps)
    assert ours == theirs
    assert qwen_vl_video._times(rules, ours, fps) == Qwen3VLProcessor._calculate_timestamps(
        None, list(theirs), fps, 2)
