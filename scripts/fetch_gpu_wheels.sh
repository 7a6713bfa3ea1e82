#!/usr/bin/env bash
# Download the wheels a GPU box (Python 3.12, x86_64, no index) lacks, none of their
# dependencies (the box has the rest), each set in a folder of its own under .whl, so a
# run carries only what it needs (the device tool carries at most 64 MiB with the tree):
#
#   bash scripts/fetch_gpu_wheels.sh [SET...]   # default: server qwen3-tts tools
#
#   server    scripts/gpu_wheels.txt -> .whl/server (~27 MB): scripts/gpu_run.sh installs
#             it for every case (carry .whl/server)
#   qwen3-tts scripts/qwen3_tts_gpu_wheels.txt -> .whl/qwen3-tts (~19 MB): the `qwen3-tts`
#             stage environment (`bash scripts/gpu_run.sh qwen3tts`; carry .whl/qwen3-tts)
#   tools     py-spy -> .whl/tools (~3 MB): the qwen3tts case's `spy` part
#   media     PyAV -> .whl/media (~36 MB): decoding uploaded audio/video (the qwen3tts
#             `clone` part's reference clip); installed beside .whl/server when carried
#
# PYTHON_VERSION=3.11 fetches them for another interpreter (a test of the environment on
# this machine).
set -euo pipefail
cd "$(dirname "$0")/.."
sets=("$@"); [ ${#sets[@]} -gt 0 ] || sets=(server qwen3-tts tools)
# pip matches each manylinux tag exactly: the ones these wheels are published under
platforms=()
for tag in manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_26_x86_64 \
  manylinux_2_27_x86_64 manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux1_x86_64 \
  manylinux_2_5_x86_64; do
  platforms+=(--platform "$tag")
done
fetch() {  # DIR WHEEL...
  local dir=$1; shift
  mkdir -p "$dir"
  python3 -m pip download -q --only-binary=:all: --no-deps --python-version "${PYTHON_VERSION:-3.12}" \
    --implementation cp "${platforms[@]}" -d "$dir" "$@"
  echo "fetch_gpu_wheels: $# wheels in $dir ($(du -sh "$dir" | cut -f1))"
}
listed() { grep -vE '^\s*(#|$)' "$1"; }
for set in "${sets[@]}"; do
  case $set in
    server) mapfile -t w < <(listed scripts/gpu_wheels.txt); fetch .whl/server "${w[@]}" ;;
    qwen3-tts) mapfile -t w < <(listed scripts/qwen3_tts_gpu_wheels.txt); fetch .whl/qwen3-tts "${w[@]}" ;;
    tools) fetch .whl/tools py-spy==0.4.3 ;;
    media) fetch .whl/media "$(grep -E '^av==' constraints.txt)" ;;
    *) echo "fetch_gpu_wheels: unknown set '$set' (server, qwen3-tts, tools, media)" >&2; exit 2 ;;
  esac
done
