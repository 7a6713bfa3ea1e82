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
