"""SIGTERM while a video job runs: the drain lets it finish, and finishing includes
encoding and storing its file, so the job survives the restart as completed; a job created
during the drain is refused with 503 shutting_down. Both found by the soak (bench/soak.py):
the drain ended when the job's denoising did and the app's cleanup then cancelled the job
while it was encoding (failed, 'server_stopped'); a new job was accepted (200, queued) and
then failed."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from test_server_e2e import Server, _get, _post

from omni.fixtures.tiny_models import ensure_tiny_model


@pytest.mark.timeout(240)
def test_a_video_job_in_flight_at_sigterm_is_completed_by_the_drain(tmp_path: Path) -> None:
    video_dir = ensure_tiny_model("wan_t2v", tmp_path / "models")
    data_dir = tmp_path / "data"
    server = Server("--model", str(video_dir), "--served-model-name", "video",
                    "--data-dir", str(data_dir), "--drain-timeout", "60")
    try:
        server.wait_listening(timeout=120)
        status, job = _post(server.url("/v1/videos"), {
            "model": "video", "prompt": "a fox", "num_frames": 9, "size": "32x32",
            "num_inference_steps": 30})
        assert status == 200, job
        record = data_dir / "videos" / f"{job['id']}.json"
        deadline = time.monotonic() + 60
        while _get(server.url(f"/v1/videos/{job['id']}"))[1]["progress"] == 0:
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.05)  # until it is denoising, well before its last step
        assert _get(server.url(f"/v1/videos/{job['id']}"))[1]["status"] == "in_progress"
        server.proc.terminate()
        while _get(server.url("/health"))[0] == 200:  # until the drain has begun
            assert time.monotonic() < deadline, "the drain never began"
            time.sleep(0.02)
        status, refused = _post(server.url("/v1/videos"), {
            "model": "video", "prompt": "a fox", "num_frames": 5, "size": "32x32"})
        assert status == 503 and refused["error"]["code"] == "shutting_down", refused
        assert server.proc.wait(90) == 0, server.log()
    finally:
        server.stop()
    stored = json.loads(record.read_text())
    assert stored["status"] == "completed", stored
    assert (data_dir / "videos" / f"{job['id']}.mp4").stat().st_size > 0
