#!/usr/bin/env bash
# The `qwen3-tts` stage environment on a GPU box, offline: over the box's own python3 (its
# CUDA torch and the libraries it already has), with only what it lacks or holds at other
# versions installed from a wheel folder (scripts/qwen3_tts_gpu_wheels.txt, fetched by
# scripts/fetch_gpu_wheels.sh), each --no-deps, and omni itself --no-deps.
#
#   bash scripts/install_qwen3_tts_gpu_env.sh [WHEEL_DIR]   # default .whl/qwen3-tts
#
# makes $OMNI_ENVS_DIR/qwen3-tts (default ~/.cache/omni/envs/qwen3-tts), the environment
# `env: qwen3-tts` runs (docs/models.md). scripts/install_qwen3_tts_env.sh builds the same
# environment from an index, pins and CPU torch included; it cannot on the box (no index,
# and its torch pin is not the box's CUDA build).
#
# Why not `venv --system-site-packages`: the box's python3 is itself a virtual environment
# (/opt/torch/.venv), and a venv made from one gets the base installation's packages, not
# that environment's (torch is not among them). So the environment is a plain venv whose
# site-packages holds two path files: the first puts its own site-packages ahead of
# PYTHONPATH (scripts/gpu_run.sh puts the server's wheels there, transformers 5.x among
# them, and the engine process inherits it), the last appends python3's own site
# directories (site.addsitedir: their .pth files are read too). The environment's pins
# win; whatever it lacks comes from python3's.
# PYTHON picks the base interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=$(realpath "${1:-.whl/qwen3-tts}")
base=${PYTHON:-python3}
envs=${OMNI_ENVS_DIR:-$HOME/.cache/omni/envs}
target=$envs/qwen3-tts
ls "$wheels"/*.whl >/dev/null || { echo "install_qwen3_tts_gpu_env: no wheels in $wheels (scripts/fetch_gpu_wheels.sh)" >&2; exit 2; }
mkdir -p "$envs"
rm -rf "$target"
# no pip of its own: python3's pip (on the path through the second file) installs into it
"$base" -m venv --without-pip "$target"
py=$target/bin/python
site=$($py -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$base" - "$site" "$($py -c 'import sys; print(sys.prefix)')" <<'PY'
import site
import sys
from pathlib import Path

env_site, env_prefix = sys.argv[1], sys.argv[2]
dirs = [d for d in site.getsitepackages() if Path(d).is_dir()]
if site.ENABLE_USER_SITE and Path(site.getusersitepackages()).is_dir():
    dirs.append(site.getusersitepackages())
# only when this environment runs: a venv made over this one must not move it forward
first = (f"import sys; p = {env_site!r}; sys.prefix == {env_prefix!r} and p in sys.path "
         "and (sys.path.remove(p), sys.path.insert(0, p))\n")
Path(env_site, "00-omni-env-first.pth").write_text(first)
Path(env_site, "zz-omni-base-site.pth").write_text(
    "".join(f"import site; site.addsitedir({d!r})\n" for d in dirs))
print(f"install_qwen3_tts_gpu_env: over {sys.executable}'s {', '.join(dirs)}")
PY
# --ignore-installed: the box's own versions are not touched, only shadowed
$py -m pip install -q --no-index --no-deps --ignore-installed --no-warn-conflicts \
  --find-links "$wheels" -r scripts/qwen3_tts_gpu_wheels.txt
# omni's engine side from this checkout; built with python3's setuptools (no index)
# (setuptools' build talk is shown only when the build fails)
built=$($py -m pip install -q --no-index --no-deps --no-build-isolation --no-warn-conflicts . 2>&1) \
  || { echo "$built" >&2; exit 1; }
$py -m pip freeze --path "$site" >"$target/omni-stage-env.txt"
$py - <<'PY'
import importlib.metadata as m

import omni.engines.proc.main  # noqa: F401
import torch
from qwen_tts import Qwen3TTSModel  # noqa: F401

print("install_qwen3_tts_gpu_env: ready:", *(f"{n} {m.version(n)}" for n in (
    "qwen-tts", "transformers", "tokenizers", "huggingface-hub")),
    f"torch {torch.__version__} (cuda: {torch.cuda.is_available()})")
PY
