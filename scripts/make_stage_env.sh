#!/usr/bin/env bash
# Build a named environment for stages whose model code needs other library versions than
# the server's (`env: NAME` in a pipeline file; docs/pipeline.md, docs/models.md):
#
#   scripts/make_stage_env.sh NAME REQUIREMENTS_FILE [WHEEL_DIR]
#
# makes $OMNI_ENVS_DIR/NAME (default ~/.cache/omni/envs/NAME), a virtual environment with
#   - the model's libraries, as REQUIREMENTS_FILE names them: pin each with == and the
#     environment is the same wherever it is built (unpinned lines are reported);
#   - omni's engine side: omni itself without its dependencies (pip --no-deps: none of the
#     server's libraries come along), plus the few that the engine process imports
#     (ENGINE_DEPS: torch, numpy, msgspec, pyzmq, PyYAML, prometheus-client, at
#     setup.cfg's floors), resolved together with the model's pins so that those win.
# WHEEL_DIR: build offline, every package from that directory (pip --no-index
# --find-links WHEEL_DIR); it must also hold setuptools and wheel, which build omni's wheel.
# A failed build puts the old environment back. What went in: NAME/omni-stage-env.txt
# (pip freeze: a requirements file that builds the same environment again).
# PYTHON picks the base interpreter (default python3; omni needs 3.11 or later).
set -euo pipefail
[[ $# -ge 2 && $# -le 3 ]] || { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
name=$1
requirements=$(realpath "$2")
wheels=${3:+$(realpath "$3")}
repo=$(cd "$(dirname "$0")/.." && pwd)
[[ $name =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || { echo "make_stage_env: bad NAME '$name' (letters, digits, . _ -)" >&2; exit 2; }
[[ -f $requirements ]] || { echo "make_stage_env: no requirements file $2" >&2; exit 2; }
envs=${OMNI_ENVS_DIR:-$HOME/.cache/omni/envs}
target=$envs/$name
mkdir -p "$envs"

pip_from=()
[[ -n $wheels ]] && pip_from=(--no-index --find-links "$wheels")
unpinned=$(grep -vE '^\s*(#|$|-)' "$requirements" | grep -vE '==|===| @ ' || true)
[[ -z $unpinned ]] || echo "make_stage_env: not pinned with == (a rebuild may differ): $(echo $unpinned)" >&2

# ENGINE_DEPS: what omni's engine process imports beyond the model's libraries, at the
# floors setup.cfg declares (read from there: one place for them)
mapfile -t engine_deps < <("${PYTHON:-python3}" - "$repo/setup.cfg" <<'PY'
import configparser
import re
import sys

ENGINE_DEPS = ("torch", "numpy", "msgspec", "pyzmq", "PyYAML", "prometheus-client")
setup = configparser.ConfigParser()
setup.read(sys.argv[1])
declared = {re.split(r"[<>=!~ ;]", line.strip(), maxsplit=1)[0].lower(): line.strip()
            for line in setup["options"]["install_requires"].splitlines() if line.strip()}
for dep in ENGINE_DEPS:
    print(declared.get(dep.lower(), dep))
PY
)

# a venv is not relocatable (its scripts name its path): it is built in place, the old one
# kept aside until the new one imports
# an .old left by an interrupted build is the last good one: put it back first
[[ -e $target.old ]] && { rm -rf "$target"; mv "$target.old" "$target"; }
[[ -e $target ]] && mv "$target" "$target.old"
restore() {
  rm -rf "$target"
  [[ -e $target.old ]] && mv "$target.old" "$target"
  echo "make_stage_env: building $target failed (above); the old environment, if any, is kept" >&2
}
trap 'restore; exit 1' INT TERM
trap restore ERR
"${PYTHON:-python3}" -m venv "$target"
py=$target/bin/python
# the model's pins and the engine's floors in one resolve: pip fails here, naming both,
# when they cannot agree
$py -m pip install -q "${pip_from[@]}" -r "$requirements" "${engine_deps[@]}"
# omni's engine side: its code (from this checkout) without its dependencies
$py -m pip install -q "${pip_from[@]}" --no-deps "$repo"
$py -c "import omni.engines.proc.main" \
  || { echo "make_stage_env: omni's engine side does not import (the missing module is above): add it to $2" >&2; false; }
trap - ERR INT TERM
rm -rf "$target.old"
{
  echo "# scripts/make_stage_env.sh $name $2${3:+ $3}: what it installed (pip freeze)"
  $py -m pip freeze | grep -vE '^omni[ =@]'
} >"$target/omni-stage-env.txt"
echo "make_stage_env: $target is ready: 'env: $name' in a stage runs it ($py)"
$py - <<'PY'
import importlib.metadata
import platform

def version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None

found = [f"{n} {version(n)}" for n in ("torch", "transformers") if version(n)]
print("  python", platform.python_version(), *found)
PY
