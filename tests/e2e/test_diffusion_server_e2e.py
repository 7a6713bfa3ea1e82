"""`python -m omni.server --model <diffusers dir>`: images and videos from the command line."""

from __future__ import annotations

import base64
import io
import json
import urllib.request
from pathlib import Path

from PIL import Image
from test_server_e2e import Server, _post

from omni.fixtures.tiny_models import ensure_tiny_model


def test_serves_images_and_videos_from_diffusers_directories(tmp_path: Path) -> None:
    cache = tmp_path / "models"
    image_dir = ensure_tiny_model("qwen_image", cache)
    video_dir = ensure_tiny_model("wan_t2v", cache)
    data_dir = tmp_path / "data"
    server = Server("--model", str(image_dir), "--model", str(video_dir),
                    "--data-dir", str(data_dir), "--max-video-jobs", "2")
    try:
        server.wait_listening(timeout=120)
        with urllib.request.urlopen(server.url("/v1/models"), timeout=10) as resp:
            cards = {m["id"]: m for m in json.loads(resp.read())["data"]}
        # the family each directory names (the preset picked from it), and one card per stage
        assert cards["qwen_image"]["families"] == ["QwenImagePipeline"]
        assert cards["wan_t2v"]["families"] == ["WanPipeline"]
        stage = next(iter(cards["wan_t2v"]["stages"].values()))
        assert stage["engine"] == "diffusion" and stage["replicas"] >= 1
        status, body = _post(server.url("/v1/images/generations"), {
            "model": "qwen_image", "prompt": "a red fox", "size": "32x32",
            "num_inference_steps": 2, "seed": 1})
        assert status == 200, body
        image = Image.open(io.BytesIO(base64.b64decode(body["data"][0]["b64_json"])))
        assert image.size == (32, 32)
        status, job = _post(server.url("/v1/videos"), {
            "model": "wan_t2v", "prompt": "a fox", "seconds": "1", "size": "32x32",
            "num_inference_steps": 2})
        assert status == 200 and job["status"] == "queued", job
        assert (data_dir / "videos" / f"{job['id']}.json").is_file()
        req = urllib.request.Request(server.url("/v1/videos/sync"), json.dumps({
            "model": "wan_t2v", "prompt": "a fox", "num_frames": 5, "size": "32x32",
            "num_inference_steps": 2}).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert resp.headers["Content-Type"] == "video/mp4" and resp.read()[4:8] == b"ftyp"
    finally:
        server.stop()
    assert "stopped" in server.log()


def test_help_explains_the_video_flags() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "omni.server", "--help"], capture_output=True,
                         text=True, timeout=60)
    for flag in ("--data-dir", "--video-retention-hours", "--max-video-jobs"):
        assert flag in out.stdout
