"""The benchmark entry points import and explain their flags (they are not run here)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("args", [["-m", "bench", "--help"], ["-m", "bench", "core", "--help"],
                                  ["-m", "bench", "startup", "--help"],
                                  ["-m", "bench", "tts", "--help"],
                                  ["-m", "bench.shm_throughput", "--help"],
                                  ["-m", "bench.cuda_ipc", "--help"]])
def test_bench_help(args: list[str]) -> None:
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--" in out.stdout and "usage" in out.stdout.lower()
