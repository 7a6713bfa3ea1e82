"""scripts/make_stage_env.sh's refusals and its failure path: a build that fails puts the
old environment back (a stage naming it keeps working). The successful build needs
packages (torch) and takes half a minute offline: docs/pipeline.md shows one, measured in
bench/results/stage-env.md."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_stage_env.sh"


def make(*args: str, envs: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **({"OMNI_ENVS_DIR": str(envs)} if envs else {})}
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True,
                          text=True, timeout=300)


def test_usage_and_bad_arguments(tmp_path):
    usage = make()
    assert usage.returncode == 2 and "make_stage_env.sh NAME REQUIREMENTS_FILE" in usage.stdout
    requirements = tmp_path / "r.txt"
    requirements.write_text("torch==2.13.0\n")
    bad = make("../up", str(requirements))
    assert bad.returncode == 2 and "bad NAME '../up'" in bad.stderr
    missing = make("ok", str(tmp_path / "none.txt"))
    assert missing.returncode == 2 and "no requirements file" in missing.stderr


def test_a_failed_build_keeps_the_old_environment(tmp_path):
    envs, wheels = tmp_path / "envs", tmp_path / "wheels"
    (envs / "tts").mkdir(parents=True)
    (envs / "tts" / "in-use").write_text("the environment a stage runs now")
    wheels.mkdir()  # offline, and empty: the install cannot succeed
    requirements = tmp_path / "r.txt"
    requirements.write_text("surely-not-a-package==1.0\nunpinned-too\n")
    result = make("tts", str(requirements), str(wheels), envs=envs)
    assert result.returncode != 0
    assert "not pinned with == (a rebuild may differ): unpinned-too" in result.stderr
    assert "the old environment, if any, is kept" in result.stderr
    assert (envs / "tts" / "in-use").read_text() == "the environment a stage runs now"
    assert sorted(p.name for p in envs.iterdir()) == ["tts"]
