#!/usr/bin/env bash
# A second environment, ./.venv-lerobot, holding LeRobot 0.4.4 (the newest on PyPI for
# Python 3.11) for the π0 conformance test (tests/lerobot/): LeRobot's own pre- and
# post-processors against the actions omni serves. The server under test runs from ./.venv
# (OMNI_PYTHON); transformers' π0 runs there too (LeRobot's transformers 4 has none).
#   bash scripts/install_lerobot_env.sh
#   OMNI_PYTHON=$PWD/.venv/bin/python .venv-lerobot/bin/python -m pytest tests/lerobot
#
# Not `pip install lerobot`: lerobot 0.4.4 requires torch<2.11 and torchvision<0.26, which
# exist here only as multi-GB CUDA builds (the CPU torch on this machine's disk is 2.13.0),
# and pip cannot resolve it beside torch 2.13.0. So lerobot goes in --no-deps, with what
# its processor and π0 modules import (lerobot.processor pulls lerobot.datasets, hence
# datasets, torchvision, av, imageio; the policy factory pulls gymnasium and diffusers) at
# versions inside lerobot's own ranges, and transformers 4.57 (its `transformers-dep`
# range, <5: lerobot.policies imports groot, whose config dataclass breaks on
# transformers 5). Outside lerobot's ranges: torch 2.13.0, torchvision 0.28.0 (PyPI's
# build is for CUDA torch: its compiled ops do not load, see tests/lerobot/conftest.py)
# and packaging 26. LeRobot's own π0 model cannot run at all: it checks for its patched
# transformers ("transformers_replace", transformers.models.siglip.check) in __init__.
# openpi-client goes in --no-deps too: it pins numpy<2, but the code it runs is plain
# msgpack + websockets and works on numpy 2.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x .venv-lerobot/bin/python ]] || python3 -m venv .venv-lerobot
py=.venv-lerobot/bin/python
pip=("$py" -m pip install -q --disable-pip-version-check)
"$py" -m pip install -q -U pip
# torch and torchvision named in every call: pip must never trade the CPU torch on disk
# for a CUDA build from the index
torch=("torch==2.13.0" "torchvision==0.28.0")
"${pip[@]}" --no-deps "lerobot==0.4.4" "openpi-client==0.1.2"
# (the next call's resolver lists lerobot's and openpi-client's pins it leaves unmet: the
# ones named above)
"${pip[@]}" "${torch[@]}" \
  "transformers==4.57.6" "huggingface-hub==0.35.3" "datasets==4.8.4" "accelerate==1.15.0" \
  "diffusers==0.35.2" "gymnasium==1.2.3" "draccus==0.10.0" "deepdiff==8.6.2" \
  "einops==0.8.2" "av==15.1.0" "imageio==2.38.2" "pyserial==3.5" "numpy==2.4.6" \
  "msgpack==1.2.4" "websockets==17.4" "typing_extensions==4.16.0" \
  "pytest==8.4.2" "pytest-timeout==2.4.0"
# the import the tests make, through the same torchvision declaration
(cd tests/lerobot && "../../$py" - <<'EOF'
import conftest  # noqa: F401  (declares torchvision's two unguarded ops)
import lerobot, torch, transformers
from lerobot.policies.factory import make_pre_post_processors  # noqa: F401
from lerobot.policies.pi0.modeling_pi0 import PI0Policy  # noqa: F401
from openpi_client import websocket_client_policy  # noqa: F401
print(f"install_lerobot_env: done (lerobot {lerobot.__version__}, torch {torch.__version__}, "
      f"transformers {transformers.__version__})")
EOF
)
