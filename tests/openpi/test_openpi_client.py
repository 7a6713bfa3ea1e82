"""The unmodified openpi-client (0.1.2, numpy<2, its own environment) against
``python -m omni.server --model <tiny π0>``: metadata, correctly shaped actions, eight
robots at once batched by the engine and each equal to its observation run alone with
the same seed, error frames the client survives, and the Api-Key header.

Run: bash scripts/install_openpi_env.sh && .venv-openpi/bin/python -m pytest tests/openpi
(OMNI_PYTHON names the interpreter that runs the server; default ./.venv/bin/python)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from openpi_client import websocket_client_policy as wcp

ROOT = Path(__file__).resolve().parents[2]
OMNI_PYTHON = os.environ.get("OMNI_PYTHON", str(ROOT / ".venv" / "bin" / "python"))
KEY = "robot-key"


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    model_dir = subprocess.run(
        [OMNI_PYTHON, "-c", "from omni.fixtures.tiny_models import ensure_tiny_model; "
         "print(ensure_tiny_model('pi0'))"], check=True, capture_output=True, text=True,
        env=env, cwd=ROOT).stdout.strip().splitlines()[-1]
    log = tmp_path_factory.mktemp("openpi") / "server.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [OMNI_PYTHON, "-m", "omni.server", "--model", model_dir, "--port", "0",
             "--policy-seed", "3", "--api-key", KEY], stdout=out, stderr=subprocess.STDOUT,
            env=env, cwd=ROOT)
    try:
        found = None
        for _ in range(600):
            found = re.search(r"listening on http://[\d.]+:(\d+)", log.read_text())
            if found or server.poll() is not None:
                break
            time.sleep(0.5)
        assert found, log.read_text()
        yield int(found.group(1))
    finally:
        server.terminate()
        server.wait(30)
    sys.stdout.write(log.read_text()[-2000:])


@pytest.fixture
def connect(port):
    """connect() -> a robot's client; each hangs up when its test ends (the client has no
    close()), so the server's stop at the module's end waits on no open session (~10 s)."""
    robots = []

    def connect_one() -> wcp.WebsocketClientPolicy:
        robots.append(wcp.WebsocketClientPolicy(host="127.0.0.1", port=port, api_key=KEY))
        return robots[-1]

    yield connect_one
    for robot in robots:
        robot._ws.close()


def observation(i: int, seed: int | None = None) -> dict:
    rng = np.random.default_rng(i)
    obs = {"observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
           "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
           "observation/state": rng.standard_normal(8), "prompt": f"task number {i}"}
    return obs if seed is None else {**obs, "seed": seed}


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    values = re.findall(rf"^{name}{{[^}}]*}} ([\d.e+]+)$", text, re.M)
    return max(float(v) for v in values)


def test_the_client_gets_metadata_and_an_action_chunk(connect):
    policy = connect()
    meta = policy.get_server_metadata()
    assert meta["action_horizon"] == 50 and meta["action_dim"] == 7
    result = policy.infer(observation(0))
    assert isinstance(result["actions"], np.ndarray)
    assert result["actions"].shape == (50, 7) and result["actions"].dtype == np.float32
    assert result["server_timing"]["infer_ms"] > 0
    assert result["seed"] == 3  # --policy-seed 3, the connection's first call


def test_eight_robots_are_batched_and_each_equals_its_run_alone(port, connect):
    robots = [connect() for _ in range(8)]
    together: dict[int, np.ndarray] = {}
    barrier = threading.Barrier(8)

    def act(i: int) -> None:
        barrier.wait()
        for _ in range(3):  # several rounds: robots meet mid-chunk and at its start
            together[i] = robots[i].infer(observation(i, seed=1000 + i))["actions"]

    threads = [threading.Thread(target=act, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(together) == 8
    assert metric(port, "omni_replica_max_batch_rows") >= 2  # shared forward passes
    alone = connect()
    for i in range(8):
        expected = alone.infer(observation(i, seed=1000 + i))["actions"]
        np.testing.assert_allclose(together[i], expected, atol=1e-5)
    # the chunks differ by robot: the equality above could not pass by accident
    assert np.abs(together[0] - together[1]).max() > 1e-2


def test_an_error_frame_raises_and_the_connection_survives(connect):
    policy = connect()
    with pytest.raises(RuntimeError, match="bad observation"):
        policy.infer({"prompt": "no cameras here"})
    assert policy.infer(observation(1))["actions"].shape == (50, 7)


def test_a_wrong_key_is_refused_before_the_upgrade(port):
    with pytest.raises(Exception, match="401"):
        wcp.WebsocketClientPolicy(host="127.0.0.1", port=port, api_key="wrong")
    health = urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz")
    assert health.status == 200
