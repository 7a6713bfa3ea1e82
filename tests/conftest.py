"""Suite-wide settings: one intra-op thread (two cores make default threading noisy)."""

import importlib.util
import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# tests/openpi/ runs the unmodified openpi-client, which pins numpy<2: it runs in its own
# environment (scripts/install_openpi_env.sh; .ci/run runs it and fails if it cannot)
collect_ignore = []
if importlib.util.find_spec("openpi_client") is None:
    collect_ignore.append("openpi")


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """name -> the directory (str) of tiny fixture ``name``, built once per session in the
    session's models folder, which other tests' fixtures build into as well."""
    from omni.fixtures.tiny_models import ensure_tiny_model

    cache = tmp_path_factory.getbasetemp() / "models"
    return lambda name: str(ensure_tiny_model(name, cache))


@pytest.fixture
def preset_envs(tmp_path, monkeypatch):
    """Presets whose stage runs in a named environment (``env: NAME``) load only where it
    is built; where one is not, a stand-in (this interpreter) lets the files load, for
    tests that read the presets' stages, not their environments."""
    import re
    import sys

    from omni.config.environments import env_python
    from omni.config.presets import PRESET_DIR

    names = {m for p in PRESET_DIR.glob("*.yaml")
             for m in re.findall(r"^\s+env:\s*([\w.-]+)", p.read_text(), re.M)}
    if all(os.access(env_python(name), os.X_OK) for name in names):
        return
    envs = tmp_path / "standin-envs"
    for name in names:
        (envs / name / "bin").mkdir(parents=True)
        (envs / name / "bin" / "python").symlink_to(sys.executable)
    monkeypatch.setenv("OMNI_ENVS_DIR", str(envs))


_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Sum each file's setup, call and teardown time (module fixtures count where they
    start), for the summary below."""
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """The 25 files that took longest, beside --durations' slowest tests (setup.cfg): CI
    prints where its time goes on every run."""
    slowest = sorted(_FILE_SECONDS.items(), key=lambda item: -item[1])[:25]
    if not slowest:
        return
    terminalreporter.section("slowest files (setup + call + teardown)")
    for path, seconds in slowest:
        terminalreporter.write_line(f"{seconds:8.2f}s {path}")
