#!/usr/bin/env bash
# The browser the playground's end-to-end tests drive (tests/e2e/test_playground_*):
# Debian's chromium, and Playwright for Python (pinned) in ./.venv. Playwright never
# downloads a browser of its own here (no `playwright install`): the tests launch
# /usr/bin/chromium through executable_path (tests/e2e/browserutil.py).
#   bash scripts/install_browser.sh            # PY=... picks another interpreter
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if ! command -v chromium >/dev/null 2>&1; then
  [[ $(id -u) -eq 0 ]] || { echo "install_browser: run as root to apt-get install chromium"; exit 1; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q chromium >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }
fi
PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 "$PY" -m pip install -q --disable-pip-version-check -c constraints.txt \
  "playwright==1.65.2"
echo "install_browser: done ($(chromium --version 2>/dev/null | head -1), playwright" \
  "$("$PY" -c 'from importlib.metadata import version; print(version("playwright"))'))"
