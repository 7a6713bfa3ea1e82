"""The built wheel carries the pipeline presets (omni/config/presets/*.yaml), and they load
from it: a regular install, unlike the editable one the suite runs against, sees only what
setup.cfg's [options.package_data] put in the wheel.

The wheel is built offline (`pip wheel --no-deps --no-build-isolation --no-index`) from a
copy of the sources, so a stale build/ directory or egg-info in the checkout can neither
leak into the wheel nor be written by the test. It is then unzipped, not installed, and a
fresh interpreter imports omni from the unzipped tree alone (the editable install's finder
removed) and loads every preset.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PRESETS = REPO_ROOT / "omni" / "config" / "presets"
PRESET_NAMES = sorted(p.stem for p in PRESETS.glob("*.yaml"))
# what setuptools reads to build the project (README.md: long_description = file:)
BUILD_FILES = ("pyproject.toml", "setup.cfg", "setup.py", "MANIFEST.in", "README.md")
BUILD_TIMEOUT_S = 300

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT_S + 60)


def _offline_build_impossible() -> str | None:
    """Why this venv cannot build a wheel without the network, or None when it can."""
    if importlib.util.find_spec("pip") is None:
        return "pip is not installed in this interpreter's environment"
    # read from the metadata: importing setuptools here would swap distutils under pytest
    try:
        setuptools = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return ("setuptools is not installed in the venv, and --no-build-isolation builds "
                "with the venv's own setuptools (fetching it needs the network)")
    version = tuple(int(x) for x in setuptools.split(".")[:2] if x.isdigit())
    # setuptools >= 70.1 has bdist_wheel itself; older ones need the `wheel` package
    if version < (70, 1) and importlib.util.find_spec("wheel") is None:
        return (f"setuptools {setuptools} needs the `wheel` package to build a wheel, and "
                "it is not installed in the venv (fetching it needs the network)")
    return None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    reason = _offline_build_impossible()
    if reason:
        pytest.skip(f"cannot build a wheel offline: {reason}")
    work = tmp_path_factory.mktemp("wheel")
    src, out = work / "src", work / "dist"
    shutil.copytree(REPO_ROOT / "omni", src / "omni",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    for name in BUILD_FILES:
        if (REPO_ROOT / name).is_file():
            shutil.copy2(REPO_ROOT / name, src / name)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
           "--no-index", "--disable-pip-version-check", "-w", str(out), str(src)]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                          cwd=work, env={**os.environ, "PIP_NO_INPUT": "1"})
    elapsed = time.monotonic() - start
    # with --no-deps, --no-build-isolation and --no-index pip never fetches anything, so
    # a failure here is a packaging bug, not a missing network: fail, do not skip
    assert proc.returncode == 0, (f"pip wheel failed ({elapsed:.1f} s): {' '.join(cmd)}\n"
                                  f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    wheels = sorted(out.glob("omni-*.whl"))
    assert len(wheels) == 1, f"expected one omni wheel in {out}, got {wheels}"
    print(f"built {wheels[0].name} in {elapsed:.1f} s")
    return wheels[0]


@pytest.fixture(scope="module")
def unzipped(wheel, tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("unzipped")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    return site


def test_the_source_tree_has_presets():
    assert PRESET_NAMES, f"no *.yaml under {PRESETS}"
    assert "echo" in PRESET_NAMES


def test_wheel_holds_every_preset_unchanged(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        missing = [f"omni/config/presets/{n}.yaml" for n in PRESET_NAMES
                   if f"omni/config/presets/{n}.yaml" not in names]
        assert not missing, (f"{wheel.name} lacks {missing}: check setup.cfg "
                             "[options.package_data] (omni = config/presets/*.yaml)")
        changed = [n for n in PRESET_NAMES
                   if zf.read(f"omni/config/presets/{n}.yaml")
                   != (PRESETS / f"{n}.yaml").read_bytes()]
        assert not changed, f"presets that differ from the source tree: {changed}"
        assert "omni/config/presets/__init__.py" in names  # the loader itself
        # no preset the source tree does not have (a stale build/ would add them)
        extra = sorted(n for n in names if n.startswith("omni/config/presets/")
                       and n.endswith(".yaml")
                       and Path(n).stem not in PRESET_NAMES)
        assert not extra, f"{wheel.name} has presets the source tree lacks: {extra}"


# Runs in a fresh interpreter: PYTHONPATH = the unzipped wheel, the editable install's
# finder dropped from sys.meta_path, so a module or preset missing from the wheel is an
# error here rather than a silent fallback to the checkout.
_LOADER = textwrap.dedent("""
    import json, sys
    from pathlib import Path

    site, repo, names, model_dir = Path(sys.argv[1]), Path(sys.argv[2]), \\
        json.loads(sys.argv[3]), Path(sys.argv[4])
    sys.meta_path[:] = [f for f in sys.meta_path
                        if "__editable__" not in getattr(f, "__module__", "")
                        and "__editable__" not in type(f).__module__]
    sys.path_hooks[:] = [h for h in sys.path_hooks
                         if "__editable__" not in getattr(h, "__module__", "")]
    sys.path[:] = [p for p in sys.path if p and "__editable__" not in p
                   and Path(p).resolve() != repo]
    sys.path_importer_cache.clear()

    import omni
    from omni.config import presets

    result = {"omni_file": omni.__file__, "preset_dir": str(presets.PRESET_DIR),
              "stages": {}, "by_table": {}}
    for name in names:
        config = presets.load_pipeline(name)
        result["stages"][name] = [stage.name for stage in config.stages]
    # the model-directory tables point at files the wheel must carry too
    for file, key, table in (("config.json", "model_type", presets.PRESET_BY_MODEL_TYPE),
                             ("model_index.json", "_class_name",
                              presets.PRESET_BY_PIPELINE_CLASS)):
        for value, preset in sorted(table.items()):
            d = model_dir / f"{key}-{value}"
            d.mkdir(parents=True)
            (d / file).write_text(json.dumps({key: value}))
            config = presets.load_pipeline(d)
            result["by_table"][value] = [preset, [s.name for s in config.stages]]
    result["omni_modules_outside"] = sorted(
        name for name, mod in sys.modules.items()
        if name.split(".")[0] == "omni" and getattr(mod, "__file__", None)
        and not Path(mod.__file__).resolve().is_relative_to(site.resolve()))
    print(json.dumps(result))
""")


def test_every_preset_loads_from_the_unzipped_wheel(unzipped, tmp_path, preset_envs):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONPATH=str(unzipped), PYTHONNOUSERSITE="1", PYTHONDONTWRITEBYTECODE="1",
               OMP_NUM_THREADS="1")
    # -P: no script directory or cwd on sys.path (site-packages stays: PyYAML and co.)
    proc = subprocess.run(
        [sys.executable, "-P", "-c", _LOADER, str(unzipped), str(REPO_ROOT.resolve()),
         json.dumps(PRESET_NAMES), str(tmp_path / "model_dirs")],
        capture_output=True, text=True, timeout=120, cwd=cwd, env=env)
    assert proc.returncode == 0, f"loading the presets from the wheel failed:\n{proc.stderr}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    site = unzipped.resolve()
    assert Path(result["omni_file"]).resolve() == site / "omni" / "__init__.py", result
    assert Path(result["preset_dir"]).resolve() == site / "omni" / "config" / "presets"
    assert not result["omni_modules_outside"], (
        f"omni modules imported from outside the wheel: {result['omni_modules_outside']}")
    assert sorted(result["stages"]) == PRESET_NAMES
    empty = [name for name, stages in result["stages"].items() if not stages]
    assert not empty, f"presets with no stages: {empty}"
    assert result["stages"]["echo"] == ["echo"]
    assert result["by_table"]["qwen3_omni_moe"] == ["qwen3_omni.yaml",
                                                    ["thinker", "talker", "code2wav"]]
    for value, (preset, stages) in result["by_table"].items():
        assert Path(preset).stem in PRESET_NAMES, f"{value} -> {preset}: not a preset"
        assert stages == result["stages"][Path(preset).stem], (value, preset)
    print(json.dumps(result["stages"]))
