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


def test_a_pipeline_saved_without_weights_loads_with_dummy_weights(tmp_path):
    """bench's ours-http with --http-load-format dummy: an in-memory pipeline saved as
    configs only (no weight file), which the server's dummy load rebuilds with the same
    component classes and model configs."""
    import torch

    from bench.media_http import save_configs
    from omni.fixtures import ensure_tiny_model
    from omni.models.flux2 import build_flux2

    def load(directory: str, load_format: str):  # through the adapter, as the server does
        return build_flux2(model_dir=directory, device="cpu", dtype="float32",
                           options={"load_format": load_format}).pipe

    pipe = load(str(ensure_tiny_model("flux2", cache_dir=tmp_path / "models")), "auto")
    saved = tmp_path / "configs"
    save_configs(pipe, str(saved))
    assert (saved / "model_index.json").is_file()
    assert not list(saved.rglob("*.safetensors")) and not list(saved.rglob("*.bin"))
    dummy = load(str(saved), "dummy")
    for name, component in pipe.components.items():
        assert type(dummy.components[name]) is type(component), name
        if isinstance(component, torch.nn.Module):
            assert _config(dummy.components[name]) == _config(component), name
    weight = next(iter(pipe.transformer.state_dict().values()))
    assert not torch.equal(next(iter(dummy.transformer.state_dict().values())), weight)


def _config(model) -> dict:
    """A model's config as a dict, less where it was read from."""
    config = model.config
    as_dict = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    return {k: v for k, v in as_dict.items() if k not in ("_name_or_path", "_diffusers_version")}
