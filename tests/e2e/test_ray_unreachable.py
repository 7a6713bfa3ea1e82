"""docs/distributed.md: "Ray itself unreachable at start: the server does not start, and
says so". `python -m omni.server` with a pipeline whose stage is placed on Ray, pointed at
an address where no Ray listens, exits non-zero soon, naming the address."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

PIPELINE = """\
name: remote
cluster: {{ray_address: "127.0.0.1:{port}"}}
stages:
  - {{name: a, engine: echo}}
  - {{name: b, engine: echo, placement: ray, final_output: text}}
edges:
  - {{from: a, to: b}}
"""
WITHIN_S = 60


def closed_port() -> int:
    with socket.socket() as probe:  # a port nothing listens on once this closes
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.timeout(WITHIN_S + 60)
def test_the_server_refuses_to_start_when_ray_is_unreachable(tmp_path):
    port = closed_port()
    pipeline = tmp_path / "remote.yaml"
    pipeline.write_text(textwrap.dedent(PIPELINE.format(port=port)))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    started = time.monotonic()
    try:
        out = subprocess.run([sys.executable, "-m", "omni.server", "--pipeline", str(pipeline),
                              "--port", "0"], capture_output=True, text=True,
                             timeout=WITHIN_S, env={**env, "OMP_NUM_THREADS": "1"})
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the server neither started nor gave up within {WITHIN_S} s: "
                    f"{(exc.stderr or b'')[-2000:]!r}")
    assert out.returncode != 0, out.stderr[-2000:]
    assert f"cannot reach the Ray cluster at '127.0.0.1:{port}'" in out.stderr, \
        out.stderr[-2000:]
    assert time.monotonic() - started < WITHIN_S
