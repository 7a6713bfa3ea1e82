#!/usr/bin/env bash
# A second environment, ./.venv-openpi, holding the unmodified openpi-client for the OpenPI
# conformance test (tests/openpi/). Its own because openpi-client 0.1.2 pins numpy<2 while
# omni's environment has numpy 2. The server under test runs from ./.venv (OMNI_PYTHON).
# openpi-client imports typing_extensions without declaring it.
#   bash scripts/install_openpi_env.sh
#   .venv-openpi/bin/python -m pytest tests/openpi
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x .venv-openpi/bin/python ]] || python3 -m venv .venv-openpi
py=.venv-openpi/bin/python
$py -m pip install -q -U pip
$py -m pip install -q "openpi-client==0.1.2" typing_extensions "pytest==8.*" pytest-timeout
$py -c 'import numpy, openpi_client.websocket_client_policy as w; print("install_openpi_env: done (numpy", numpy.__version__ + ")")'
