"""ONE server, two Python environments: the default assistant (Whisper, SmolLM2, Piper,
Silero VAD) runs in the server's, and a `engine: vllm` stage runs in `.venv-vllm`
(`python:`), whose vllm pins another transformers. Both answer correctly through the
unmodified openai SDK; the vllm stage's READY (and /v1/models) shows its environment's
interpreter and library versions, not the server's; a SIGKILLed vllm replica comes back
in its environment.

Runs from the main environment. Without `.venv-vllm` (scripts/install_vllm_env.sh;
OMNI_VLLM_PYTHON names another interpreter) it skips, saying so; with
OMNI_REQUIRE_VLLM_ENV=1 (.ci/run, which builds it) that is a failure instead."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from httputil import run

from omni.config.presets import preset_path
from omni.models.smollm2 import ensure_smollm2

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = os.environ.get("OMNI_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")
REQUIRED = os.environ.get("OMNI_REQUIRE_VLLM_ENV") == "1"
TINY = """\
name: {name}
stages:
  - name: llm
    engine: {engine}
    model_dir: {model_dir}
    memory: 256MiB
    final_output: text
    restart: true
    options: {options}
{python}"""
QUESTION = "What is the capital of France? Answer in one sentence."
HELLO = [{"role": "user", "content": "Tell me a story"}]
FIXED = {"temperature": 0, "max_tokens": 8, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def vllm_env() -> dict[str, str]:
    """The vllm environment's library versions, read from its own interpreter."""
    reason = None
    if not os.access(VLLM_PYTHON, os.X_OK):
        reason = (f"no vllm environment at {VLLM_PYTHON}: build it with "
                  "`bash scripts/install_vllm_env.sh` (or set OMNI_VLLM_PYTHON)")
    else:
        probe = subprocess.run([VLLM_PYTHON, "-c", (
            "import json; from importlib.metadata import version as v\n"
            "print(json.dumps({'transformers': v('transformers'), 'vllm': "
            "__import__('vllm').__version__}))")], capture_output=True, text=True)
        if probe.returncode:
            reason = f"{VLLM_PYTHON} cannot import vllm: {probe.stderr.strip()[-300:]}"
    if reason:
        (pytest.fail if REQUIRED else pytest.skip)(
            f"{reason}{' (OMNI_REQUIRE_VLLM_ENV=1: this test must run)' if REQUIRED else ''}")
    return json.loads(probe.stdout)


@pytest.fixture(scope="module")
def server(vllm_env, start_server, tmp_path_factory):
    from omni.fixtures import build_tiny_qwen3

    tiny = build_tiny_qwen3(tmp_path_factory.mktemp("m") / "q64", head_dim=64,
                            initializer_range=0.5)  # greedy answers that vary
    assistant = preset_path("assistant").read_text().replace(
        "    model: hf_causal\n", f"    model: hf_causal\n    model_dir: {ensure_smollm2()}\n")
    # vllm compiles its model at load (tens of seconds on 2 cores), beside four stages
    return start_server({
        "assistant": assistant,
        "tiny-vllm": TINY.format(name="tiny-vllm", engine="vllm", model_dir=tiny,
                                 options="{vllm_args: {max_model_len: 512}}",
                                 python=f"    python: {VLLM_PYTHON}\n"),
        "tiny-ar": TINY.format(name="tiny-ar", engine="ar", model_dir=tiny, options="{}",
                               python=""),
    }, start_timeout_s=600.0)


def _answers(server, model: str) -> tuple:
    async def ask():
        async with server.client(timeout=120.0) as client:
            chat = await client.chat.completions.create(model=model, messages=HELLO, **FIXED)
            done = await client.completions.create(model=model, prompt="Once upon", **FIXED)
        return (chat.choices[0].message.content, chat.usage.completion_tokens,
                done.choices[0].text.replace("\ufffd", ""))  # vllm drops a split character
    return run(ask())


def _cards(server) -> dict[str, dict]:
    async def listing():
        return [m async for m in server.client().models.list()]
    return {m.id: m.model_extra for m in run(listing())}


def _vllm_replica(server):
    return server.models["tiny-vllm"].omni.orchestrator.engines.replicas["llm/0"]


def test_one_server_answers_from_both_environments(server, vllm_env):
    async def capital():
        async with server.client(timeout=120.0) as client:
            return await client.chat.completions.create(
                model="smollm2", temperature=0, max_tokens=40,
                messages=[{"role": "user", "content": QUESTION}])
    assert "Paris" in run(capital()).choices[0].message.content
    # vllm's greedy tokens on its transformers equal the ar engine's on the server's
    assert _answers(server, "tiny-vllm") == _answers(server, "tiny-ar")
    card = _cards(server)["tiny-vllm"]["stages"]["llm"]
    assert (card["engine"], card["python"]) == ("vllm", VLLM_PYTHON)
    health, metrics = run(_health_and_metrics(server))
    assert health["models"]["tiny-vllm"]["stages"]["llm"]["live"] == 1  # as any replica
    assert any(line.startswith("omni_replica_memory_bytes{") and 'pipeline="tiny-vllm"' in line
               and 'replica="llm/0"' in line for line in metrics.splitlines())


async def _health_and_metrics(server) -> tuple[dict, str]:
    async with server.session() as session:
        async with session.get("/health") as health, session.get("/metrics") as metrics:
            return await health.json(), await metrics.text()


def test_the_vllm_stage_runs_its_environments_libraries(server, vllm_env):
    import transformers

    info = server.inspect(lambda: dict(_vllm_replica(server).info))
    assert info["python"] == VLLM_PYTHON
    assert info["versions"]["transformers"] == vllm_env["transformers"]
    assert info["versions"]["vllm"] == vllm_env["vllm"]
    assert vllm_env["transformers"] != transformers.__version__, (
        f"{VLLM_PYTHON} has the server's transformers {transformers.__version__}: rebuild it "
        "with scripts/install_vllm_env.sh, which keeps vllm's pins")
    cards = _cards(server)
    assert cards["tiny-vllm"]["stages"]["llm"]["versions"] == info["versions"]
    assert cards["smollm2"]["stages"]["llm"]["python"] == sys.executable
    assert cards["smollm2"]["stages"]["llm"]["versions"]["transformers"] == \
        transformers.__version__


def test_a_killed_vllm_replica_restarts_in_its_environment(server, vllm_env):
    before = _answers(server, "tiny-vllm")
    replica = _vllm_replica(server)
    old = server.inspect(lambda: replica.process.pid)
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 300
    while not server.inspect(lambda: replica.alive and replica.restarts == 1):
        assert time.monotonic() < deadline, "the vllm replica did not come back in 300 s"
        assert server.inspect(lambda: server.models["assistant"].omni.health()["healthy"])
        time.sleep(0.5)
    info = server.inspect(lambda: dict(replica.info))
    assert info["pid"] != old and info["python"] == VLLM_PYTHON
    assert info["versions"]["transformers"] == vllm_env["transformers"]
    assert _answers(server, "tiny-vllm") == before
