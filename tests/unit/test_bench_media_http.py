"""bench videos' ours-http rows read each video's MP4 encode time from the server's log
(only what was logged after the measured burst began)."""

from __future__ import annotations

from bench.media_http import encode_times


def test_encode_times_are_read_from_the_offset_on(tmp_path):
    log = tmp_path / "server.log"
    before = "INFO omni.api.videos: video video_sync_a: 33 frames encoded in 0.900 s (10 bytes)\n"
    log.write_text(before)
    offset = log.stat().st_size
    with open(log, "a") as f:
        f.write("INFO omni.api.videos: video video_sync_b: 33 frames encoded in 0.531 s (5 bytes)\n"
                "INFO something else\n"
                "INFO omni.api.images: image img-x: 512x512 png encoded in 0.040 s (9 bytes)\n"
                "INFO omni.api.videos: video video_sync_c: 9 frames encoded in 0.012 s (7 bytes)\n")
    assert encode_times(log, offset) == [0.531, 0.04, 0.012]
    assert encode_times(log, 0) == [0.9, 0.531, 0.04, 0.012]
    assert encode_times(tmp_path / "missing.log", 0) == []


def test_bench_diffusion_rows_count_calls_on_every_engine_side(tmp_path):
    """bench diffusion on the tiny Qwen-Image, through the server, in-process and with
    sharing forced: each row counts its burst's transformer calls and rows (the server's
    from /metrics), so the row policy's choices show in the report."""
    import json
    import os
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "bench", "diffusion", "--size", "64x64", "--steps", "4",
         "--concurrency", "4", "--per-client", "1", "--sides",
         "ours-http,ours-engine,ours-shared", "--out", str(tmp_path), "--tag", "t"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {r["side"]: r for r in json.loads((tmp_path / "diffusion-t.json").read_text())["rows"]}
    assert set(rows) == {"ours-http", "ours-engine", "ours-shared"}
    for side, row in rows.items():
        assert row["rows_run"] == 4 * 4, (side, row)  # 4 images of 4 steps, no guidance
        assert row["transformer_calls"] >= 4, (side, row)
    assert rows["ours-shared"]["transformer_calls"] == 4  # all four in every call
