#!/usr/bin/env bash
# A third environment, ./.venv-min: omni with transformers and diffusers at exactly the
# floors setup.cfg declares (read from there), everything else as constraints.txt pins it,
# and the CPU torch. CI's minimum-versions job runs the model-facing tests in it (.ci/run),
# so that the declared range is what is tested, at both ends.
#   bash scripts/install_min_env.sh
#   .venv-min/bin/python -m pytest tests/unit/test_policy_engine.py ...
set -euo pipefail
cd "$(dirname "$0")/.."

# "    transformers>=5.23,<5.25" -> 5.23: the floor of one install_requires line
floor() {
  local v
  v=$(sed -nE "s/^[[:space:]]+$1[[:space:]]*>=[[:space:]]*([0-9][0-9A-Za-z.]*).*/\\1/p" setup.cfg)
  [[ $(wc -w <<<"$v") -eq 1 ]] || { echo "install_min_env: no single '$1>=' floor in setup.cfg" >&2; exit 1; }
  echo "$v"
}
transformers=$(floor transformers)
diffusers=$(floor diffusers)

[[ -x .venv-min/bin/python ]] || python3 -m venv .venv-min
py=.venv-min/bin/python
$py -m pip install -q -U pip
if ! command -v nvidia-smi >/dev/null 2>&1 && ! $py -c 'import torch' 2>/dev/null; then
  $py -m pip install -q torch==2.13.0
fi
# constraints.txt without its transformers / diffusers pins, which the floors replace
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
grep -vE '^(transformers|diffusers)[[:space:]]*==' constraints.txt >"$constraints"
$py -m pip install -q -c "$constraints" -e '.[test]' \
  "transformers==$transformers" "diffusers==$diffusers"
$py - "$transformers" "$diffusers" <<'EOF'
import sys

import diffusers
import transformers
from packaging.version import Version

for mod, want in zip((transformers, diffusers), sys.argv[1:], strict=True):
    if Version(mod.__version__) != Version(want):
        sys.exit(f"install_min_env: {mod.__name__} {mod.__version__} installed, not {want}")
print(f"install_min_env: done (transformers {transformers.__version__}, "
      f"diffusers {diffusers.__version__})")
EOF
