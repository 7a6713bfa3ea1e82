"""bench diffusion's fp8 side in its report (bench/diffusion_report.py): the bare transformer
with fp8 blocks beside the model's dtype, and ours-fp8 against ours-engine per concurrency
(the bench itself runs on a GPU: scripts/gpu_run.sh fp8)."""

from __future__ import annotations

from bench.diffusion_report import render


def _row(side: str, c: int, steps_per_s: float) -> dict:
    return {"side": side, "concurrency": c, "steps_per_s": steps_per_s, "images_per_s": 0.5,
            "p50_s": 1.0, "p99_s": 1.1, "mean_s": 1.0, "p99_over_mean": 1.1}


def test_the_report_sets_fp8_beside_the_models_dtype():
    text = render({"shape": "qwen-image", "size": "512x512", "steps": 20, "command": "x",
                   "device": "H200", "when": "now", "per_client": 2,
                   "transformer_s": {"1": 0.040, "8": 0.200},
                   "transformer_fp8_s": {"1": 0.032, "8": 0.125},
                   "rows": [_row("ours-engine", 1, 20.0), _row("ours-fp8", 1, 25.0),
                            _row("ours-engine", 8, 30.0), _row("ours-fp8", 8, 45.0)]})
    assert "| 8 | 125.0 | 200.0 | 1.60x |" in text
    assert "fp8 blocks vs the model's dtype, c=1: 25.00 vs 20.00 steps/s (1.25x)" in text
    assert "c=8: 45.00 vs 30.00 steps/s (1.50x)" in text
    # a run without the fp8 side has no fp8 table
    assert "fp8" not in render({"shape": "s", "size": "1x1", "steps": 1, "command": "x",
                                "device": "d", "when": "w", "per_client": 1,
                                "transformer_s": {"1": 0.04}, "rows": []})
