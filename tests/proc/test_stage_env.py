"""A stage in its own Python environment (`python:`): its replicas are subprocesses of that
interpreter (omni/runtime/env_process.py), on the same control plane and shared-memory
payload plane as forked ones; restarted the same way; gone with the server; refused at
READY when their omni speaks another wire version.

The environment here is a bare venv that sees the server's libraries but not omni (a
.pth line adds the server's site-packages without running that directory's own .pth
files, among them omni's editable install), so the replicas also prove that an
environment without omni gets the server's."""

from __future__ import annotations

import os
import select
import signal
import site
import subprocess
import sys
import textwrap

import pytest
from procutil import Tap, collect, run, serving, wait_until

from omni import AsyncOmni
from omni.config.pipeline import parse_pipeline
from omni.engines.proc.spec import stage_spec
from omni.runtime.env_process import EnvProcess, omni_path
from omni.runtime.launcher import StartupError
from omni.runtime.leftovers import unlink_arenas
from omni.wire.protocol import WIRE_VERSION

BLOB = 96 * 1024  # per output: through the shm arenas, not inline


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A venv without omni that reaches the server's other libraries."""
    venv = tmp_path_factory.mktemp("env") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (venv / "lib" / version / "site-packages" / "server-libraries.pth").write_text(
        "\n".join(site.getsitepackages()) + "\n")
    python = str(venv / "bin" / "python")
    plain = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run([python, "-c", "import msgspec, zmq, torch\nimport omni"], env=plain,
                           cwd=venv,
                           capture_output=True, text=True)
    assert "No module named 'omni'" in probe.stderr, probe.stderr  # the libraries, not omni
    return python


@pytest.fixture
def no_pythonpath(monkeypatch):
    """Children see no source tree on PYTHONPATH (a test run may set one)."""
    monkeypatch.delenv("PYTHONPATH", raising=False)


def chain(python: str, **b: object):
    """a (the server's) -> b (its own environment) -> c (the server's), through shm."""
    return parse_pipeline({"name": "envs", "stages": [
        {"name": "a", "engine": "echo", "params": {"payload_bytes": BLOB, "chunks": 2}},
        {"name": "b", "engine": "echo", "python": python, "restart": True,
         "params": {"payload_bytes": BLOB}, **b},
        {"name": "c", "engine": "echo", "final_output": "text"},
    ], "edges": [{"from": "a", "to": "b", "connector": "shm"},
                 {"from": "b", "to": "c", "connector": "shm"}]})


def wrapper(tmp_path, code: str) -> str:
    """An executable standing in for an environment's python: ``code`` runs first, then
    the script the launcher asked for."""
    path = tmp_path / "python"
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(code) + textwrap.dedent("""
        import runpy
        import sys

        sys.argv = sys.argv[1:]
        runpy.run_path(sys.argv[0], run_name="__main__")
        """))
    path.chmod(0o755)
    return str(path)


def test_a_stage_in_its_own_environment_serves_restarts_and_leaves_nothing(
        bare_python, no_pythonpath):
    async def ask(omni: AsyncOmni, prompt: str) -> str:
        outputs = await collect(omni.generate({"prompt": prompt}))
        return "".join(o.data["text"] for o in outputs if o.data)

    async def body():
        async with serving(chain(bare_python)) as omni:
            tap = Tap(omni)
            group = omni.orchestrator.engines
            b = group.replicas["b/0"]
            assert isinstance(b.process, EnvProcess)
            assert b.info["python"] == bare_python and b.info["versions"]["omni"]
            assert await ask(omni, "payloads") == "payloads"  # c checked b's blobs
            assert max(r.stats.get("shm_puts", 0) for r in tap.rows if r.stage == "b") >= 1
            old = b.process.pid
            os.kill(old, signal.SIGKILL)
            await wait_until(lambda: b.restarts == 1 and b.alive, 20.0, "b's restart")
            assert b.process.pid != old and b.info["python"] == bare_python
            assert await ask(omni, "again") == "again"
            pids, prefix = [r.process.pid for r in group.replicas.values()], group.arena_prefix
        for pid in pids + [old]:  # every engine process gone, none left a zombie
            assert not os.path.exists(f"/proc/{pid}"), pid
        assert unlink_arenas(prefix + "-") == []
    run(body(), timeout_s=60)


def test_the_engine_exits_and_frees_its_arenas_when_the_server_is_gone(bare_python, tmp_path, no_pythonpath):
    pipeline = chain(bare_python)
    spec = stage_spec(pipeline, "b", 0, control_address=f"ipc://{tmp_path}/nobody.sock",
                      arena_name=f"omni-test-{os.getpid()}-b")
    arena = f"/dev/shm/{spec.arena_name}-0123abcd"  # as its first payload would make it
    process = EnvProcess(bare_python, spec, "b", omni_path(str(tmp_path)))
    try:
        assert process.is_alive()
        with open(arena, "wb"):
            pass
        process._popen.stdin.close()  # what a dead server's kernel does to its end
        assert select.select([process.sentinel], [], [], 30.0)[0], "still running"
        process.join()
        assert process.exitcode == 0 and not process.is_alive()
        assert not os.path.exists(arena)  # no server is left to remove it
    finally:
        process.kill()
        process.join()
        unlink_arenas(f"omni-test-{os.getpid()}-")


def test_another_wire_version_is_refused_at_ready(tmp_path):
    python = wrapper(tmp_path, """
        import omni.engines.proc.main
        omni.engines.proc.main.WIRE_VERSION = 99  # what an environment's other omni sends
        """)
    with pytest.raises(StartupError) as error:
        run(AsyncOmni(chain(python)).start(), timeout_s=60)
    message = str(error.value)
    assert "stage 'b' failed to start" in message
    assert f"wire version 99, this server speaks {WIRE_VERSION}: refused" in message
    assert f"Reinstall omni in the environment of {python}" in message


def test_an_environment_that_cannot_import_the_engine_says_how_to_make_one(tmp_path):
    python = wrapper(tmp_path, """
        import sys
        sys.modules["msgspec"] = None  # as in an environment without omni's engine side
        """)
    with pytest.raises(StartupError) as error:
        run(AsyncOmni(chain(python)).start(), timeout_s=60)
    message = str(error.value)
    assert f"({python}) exited with code 1 before connecting" in message
    assert "scripts/make_stage_env.sh NAME REQUIREMENTS_FILE" in message
