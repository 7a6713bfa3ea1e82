"""tests/clients/ runs the unmodified agent and app frameworks (the OpenAI Agents SDK,
langchain-openai, instructor, pipecat) in their own environment
(scripts/install_clients_env.sh; .ci/run runs it and fails if it cannot): omni's own
suite, without them, collects nothing here. There, every framework is imported directly,
so one that is missing fails rather than skips.

The server under test is ``python -m omni.server`` in omni's environment (OMNI_PYTHON,
default ./.venv/bin/python) on a tiny random Qwen3, one for the whole session. Random
weights answer junk text, so what the tests rely on is what the server guarantees
whatever the weights: tool calls under ``tool_choice`` "required" or a named function,
and ``response_format`` json_schema, are constrained to their schemas. The schemas are
bounded (short strings, enums, small integer ranges, no extra properties) so an answer
always ends within ``max_tokens``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OMNI_PYTHON = os.environ.get("OMNI_PYTHON", str(ROOT / ".venv" / "bin" / "python"))

collect_ignore_glob: list[str] = []


def clients_installed() -> bool:
    # the distribution, not find_spec("agents"): an unrelated module may share the name
    try:
        metadata.version("openai-agents")
    except metadata.PackageNotFoundError:
        return False
    return True


if not clients_installed():
    collect_ignore_glob.append("test_*.py")


class OmniServer:
    def __init__(self, port: int) -> None:
        self.port = port

    @property
    def base_url(self) -> str:
        """What every OpenAI-compatible client takes as its base URL."""
        return f"http://127.0.0.1:{self.port}/v1"


@pytest.fixture(scope="session")
def omni_server(tmp_path_factory: pytest.TempPathFactory):
    from clientutil import MODEL  # here: omni's own suite (no httpx) imports this file

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    model_dir = subprocess.run(
        [OMNI_PYTHON, "-c", "from omni.fixtures.tiny_models import ensure_tiny_model; "
         f"print(ensure_tiny_model({MODEL!r}))"], check=True, capture_output=True, text=True,
        env=env, cwd=ROOT).stdout.strip().splitlines()[-1]
    log = tmp_path_factory.mktemp("clients") / "server.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [OMNI_PYTHON, "-m", "omni.server", "--model", model_dir, "--served-model-name",
             MODEL, "--port", "0"], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        found = None
        for _ in range(600):
            found = re.search(r"listening on http://[\d.]+:(\d+)", log.read_text())
            if found or server.poll() is not None:
                break
            time.sleep(0.5)
        assert found, log.read_text()
        yield OmniServer(int(found.group(1)))
    finally:
        server.terminate()
        server.wait(30)
        sys.stdout.write(log.read_text()[-2000:])
