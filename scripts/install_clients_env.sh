#!/usr/bin/env bash
# A second environment, ./.venv-clients, holding the unmodified agent and app frameworks
# users point at omni's /v1/chat/completions, for the client conformance tests
# (tests/clients/): the OpenAI Agents SDK, langchain-openai, instructor and pipecat's
# OpenAI LLM service. The server under test runs from ./.venv (OMNI_PYTHON).
#   bash scripts/install_clients_env.sh
#   OMNI_PYTHON=$PWD/.venv/bin/python .venv-clients/bin/python -m pytest tests/clients
#
# Its own because three of the four cannot join omni's environment without moving its
# pins: openai-agents 0.24.0 requires websockets<17 (constraints.txt: 17.4), instructor
# 1.17.0 requires jiter<0.15 while openai 3.57.0 requires jiter>=0.16 (so it gets openai
# 3.3.0 here), and pipecat-ai 1.14.0 requires protobuf<7 (the main environment has 7).
# Only langchain-openai would fit there. The versions: the newest on PyPI for Python 3.11
# when the tests were written, resolved together (pip picks openai 3.3.0 for instructor).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x .venv-clients/bin/python ]] || python3 -m venv .venv-clients
py=.venv-clients/bin/python
"$py" -m pip install -q -U pip
"$py" -m pip install -q --disable-pip-version-check \
  "openai-agents==0.24.0" "langchain-openai==1.8.1" "langchain-core==1.8.3" \
  "instructor==1.17.0" "pipecat-ai[openai]==1.14.0" "openai==3.3.0" \
  "pydantic==2.14.4" "jsonschema==4.26.0" "pytest==8.4.2" "pytest-timeout==2.4.0"
"$py" - <<'EOF'
from importlib.metadata import version

import agents, instructor, langchain_openai  # noqa: F401
from pipecat.services.openai.llm import OpenAILLMService  # noqa: F401

names = ("openai-agents", "langchain-openai", "instructor", "pipecat-ai", "openai")
print("install_clients_env: done (" + ", ".join(f"{n} {version(n)}" for n in names) + ")")
EOF
