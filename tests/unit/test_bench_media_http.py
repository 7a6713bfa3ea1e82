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
