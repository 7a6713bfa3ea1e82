#!/usr/bin/env bash
# Download the wheels a GPU box (Python 3.12, x86_64, no index) needs for the `qwen3-tts`
# stage environment, exactly those scripts/qwen3_tts_gpu_wheels.txt names, none of their
# dependencies (the box has the rest):
#
#   bash scripts/fetch_gpu_wheels.sh [DIR]     # DIR default .whl/qwen3-tts
#
# PYTHON_VERSION=3.11 fetches them for another interpreter (a test of the environment on
# this machine).
#
# DIR is a folder of its own, not .whl itself: scripts/gpu_run.sh installs every
# .whl/*.whl for the server, and the server's transformers (5.x) and this transformers
# (4.57.3) cannot both go there. `bash scripts/gpu_run.sh qwen3tts` carries .whl (name it
# in the run's carry) and builds the environment from .whl/qwen3-tts.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.whl/qwen3-tts}
mkdir -p "$dir"
mapfile -t wheels < <(grep -vE '^\s*(#|$)' scripts/qwen3_tts_gpu_wheels.txt)
# pip matches each manylinux tag exactly: the ones these wheels are published under
platforms=()
for tag in manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_26_x86_64 \
  manylinux_2_27_x86_64 manylinux_2_28_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$tag")
done
python3 -m pip download -q --only-binary=:all: --no-deps --python-version "${PYTHON_VERSION:-3.12}" \
  --implementation cp "${platforms[@]}" -d "$dir" "${wheels[@]}"
echo "fetch_gpu_wheels: ${#wheels[@]} wheels in $dir ($(du -sh "$dir" | cut -f1))"
