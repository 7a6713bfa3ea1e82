#!/usr/bin/env bash
# One GPU-box session step, time-boxed so its output comes back within a 10-minute call.
#
#   bash scripts/gpu_run.sh tests        # tests/gpu (tiny models), diffusers tests need its wheel
#   bash scripts/gpu_run.sh ar [TAG]     # Qwen3-8B shape: bench ar, fuse_projections off vs on
#                                        # (VALUES="true" runs only the default)
#   bash scripts/gpu_run.sh ttft [TAG]   # Qwen3-8B shape through `python -m omni.server`: bench
#                                        # ar ours-http, c=1,8,32, 3 bursts each, 128-token
#                                        # prompts, 256 new tokens; the server's log (slow steps,
#                                        # graph memory) comes back beside the report
#   bash scripts/gpu_run.sh step [TAG]   # Qwen3-8B shape: bench.ar_step (host phases vs the GPU's
#                                        # replay; step orders off, on, chain; top kernels)
#   bash scripts/gpu_run.sh moe [TAG]    # Qwen3-30B-A3B shape (12 layers): bench ar,
#                                        # fuse_projections off vs on (grouped_mm experts)
#   bash scripts/gpu_run.sh omni [C] [S] # Qwen3-Omni shapes (24-layer thinker), the issue's
#                                        # lengths, sides S (default stream,full) at concurrency
#                                        # C (default 8; a list, e.g. 8,32, runs both on one
#                                        # server start; 8,32 with both sides outlasts a call:
#                                        # run c=32 one side at a time; TAG=... names the files,
#                                        # BURSTS=2 runs two per level, sides in both orders)
#   bash scripts/gpu_run.sh omni25 [C] [S] # Qwen2.5-Omni-7B shapes (random bf16, ~18 GB): bench
#                                        # omni --family qwen2_5_omni, 2500-token prompts, 225
#                                        # thinker tokens, 450 codes (9 s of audio), sides S
#                                        # (default stream,full) at concurrency C (default 1,8);
#                                        # LAYERS=N builds a thinker of N layers (default 28);
#                                        # stream: token2wav decodes 50/100/200-code chunks as
#                                        # codes come (the preset), full: whole utterances
#   bash scripts/gpu_run.sh core         # bench core on the host's CPUs (control plane per hop;
#                                        # before: bench/results/core-h200-host.json), after
#                                        # bench/probes/idle_wake.py (idle wake-up costs)
#   bash scripts/gpu_run.sh placement    # presets' stages on the GPU (tests), and
#                                        # `python -m omni.server --model <tiny Qwen-Image>`:
#                                        # READY line, one image, SIGTERM, nothing left behind
#   bash scripts/gpu_run.sh thinker [C] [B] # the same Qwen3-Omni model, text only (the thinker
#                                        # alone): bench ar, 2500-token prompts, concurrency C
#                                        # (default 1,8,32), bursts B (default 2,1,1): its
#                                        # TTFT without the talker and code2wav beside it
#   bash scripts/gpu_run.sh robots       # π0 at its real size (PaliGemma 3B + 300M expert,
#                                        # random, bf16): tests/gpu/test_pi0_cuda.py, then bench
#                                        # robots (OpenPI round trip c=1, chunks/s at 8 and 32)
#   bash scripts/gpu_run.sh pi0probe     # the same π0: tests/gpu/test_pi0_cuda.py, then
#                                        # bench/probes/pi0_graphs.py (each pass eager vs
#                                        # CUDA graphs, batch 1/8/32; a chunk's time)
#   bash scripts/gpu_run.sh structured   # Qwen3-8B shape (151k vocab): json_schema / required
#                                        # tool calls vs free decode, batch 8, in-process
#                                        # (bench/probes/structured_decode.py) and through
#                                        # `python -m omni.server` (structured_http.py), then
#                                        # the per-step mask times (grammar_mask.py)
#   bash scripts/gpu_run.sh prefill [LEN] # Qwen3-8B shape through `python -m omni.server`, c=8,
#                                        # 3 bursts of fresh LEN-token prompts (default 2048), 8
#                                        # new tokens: prefill_attention sdpa then varlen, after
#                                        # bench/probes/prefill_ceiling.py (the unpaged ceiling)
#   bash scripts/gpu_run.sh videos [F]   # video families at real transformer shapes (random
#                                        # bf16, built in memory): bench videos, ours-engine vs
#                                        # diffusers-seq, 832x480, 33 frames, 8 steps, c=1,4;
#                                        # F: ltx_video, wan22_ti2v or wan22_t2v (A14B, two
#                                        # 14B experts: ~57 GB, an H100 fits); default all
#                                        # three, in that order (each within its own timeout);
#                                        # F=hunyuan_video: HunyuanVideo 1.5 T2V 480p (8.3 B,
#                                        # an H100 fits; not in the default list);
#                                        # SIDES=ours-http,ours-engine,diffusers-seq adds the
#                                        # server through HTTP (the random release saved to
#                                        # /tmp and loaded by `python -m omni.server --model`:
#                                        # give it VIDEO_TIMEOUT=560 and one family a call)
#   bash scripts/gpu_run.sh mixed        # Qwen3-8B shape through `python -m omni.server`: 8 streams
#                                        # decode alone, then beside 4 clients sending 8,000-token
#                                        # prompts (bench/probes/mixed_load.py, 30 s each); with
#                                        # every step up to 8192 prompt tokens, then the measured
#                                        # step budget (step_latency_ms 50, the default)
#   bash scripts/gpu_run.sh ltx2 [C]     # LTX-2 19B (video + audio) at the release's shapes
#                                        # (random bf16, ~40 GB: an H100 fits): bench videos,
#                                        # ours-engine vs diffusers-seq with the pipeline's
#                                        # guidance (CFG, STG, modality), 768x512, 49 frames,
#                                        # 8 steps, c=C (default 1,4); LAYERS=N to cut it down
#                                        # (below 29 the STG block 28 is gone: ours skips STG);
#                                        # SIDES=ours-http,... adds the server through HTTP
#                                        # (needs PyAV, .whl/media), VIDEO_TIMEOUT=N (560)
#   bash scripts/gpu_run.sh stop         # `python -m omni.server` on tiny Qwen3 (cuda: triton's
#                                        # decode kernel) and tiny π0: a request each, SIGTERM;
#                                        # every line after "stopping:" is printed (only
#                                        # "stopped" may follow)
#   bash scripts/gpu_run.sh vlm [C]      # tiny Qwen2.5-VL, Qwen3-VL and HF-layout Whisper on cuda:
#                                        # tests/unit/test_ar_vl.py + test_whisper_hf.py (+
#                                        # test_vl_release.py), then per family at the release's
#                                        # shapes (Qwen2.5-VL-7B, Qwen3-VL-8B, whisper-large-v3;
#                                        # random bf16, built on the GPU into /tmp/m/vlm-F and
#                                        # removed after its run): bench vlm --shape release,
#                                        # sides ours-http, hf-generate, ours-inproc, concurrency
#                                        # C (default 1,8), 448 px images / 5 s clips, 64 new
#                                        # tokens; a family the call's time left cannot hold is
#                                        # skipped, saying so (FAMILIES="qwen3_vl" runs only it;
#                                        # SIDES=..., LAYERS=N for a dry run, TESTS=0 skips the
#                                        # tests, TAG=... names the
#                                        # reports, default: the card, h100 or h200);
#                                        # whisper's ours-http needs PyAV (.whl/media), else
#                                        # it is skipped
#   bash scripts/gpu_run.sh worlds       # Cosmos 3 at the release's shapes (random, bf16, ~14 B):
#                                        # bench worlds, 1 and 8 sessions, ours vs the pipeline
#   bash scripts/gpu_run.sh qwen3tts [P] # Qwen3-TTS-12Hz-1.7B's shapes: the parts P and what each
#                                        # runs are in scripts/gpu/qwen3tts.sh (printed below)
#   bash scripts/gpu_run.sh flux [TAG]   # FLUX.1-dev at the release's shapes (random, bf16,
#                                        # 11.9 B; needs the diffusers wheel): bench diffusion,
#                                        # 512x512 (SIZE=...), 20 steps, c=1,4,8: our engine vs
#                                        # diffusers sequential / batched, bare transformer
#                                        # (SIDES=... picks bench diffusion's sides, e.g.
#                                        # ours-http,ours-engine,diffusers-seq: the server
#                                        # through HTTP too, first, the bench's copy parked
#                                        # in host memory; same for flux2, hunyuan_image;
#                                        # BENCH_TIMEOUT=N, default 480, hunyuan_image 540;
#                                        # CONC=1,4 PER_CLIENT=1: fewer images a side)
#   bash scripts/gpu_run.sh flux2 [TAG]  # the same for FLUX.2-dev (32 B transformer, random bf16,
#                                        # ~66 GiB: an H100 fits the in-process sides; its
#                                        # ours-http side needs HTTP_LOAD_FORMAT=dummy: saved
#                                        # as configs only, the server draws the weights; the
#                                        # same for videos' wan22_t2v with ours-http (flux2 ran on
#                                        # an H100, session 16; wan22_t2v untried)
#   bash scripts/gpu_run.sh hunyuan_image [TAG] # HunyuanImage 2.1 at the release's shapes (random
#                                        # bf16, ~17 B transformer, APG guiders: two rows per
#                                        # image; ~40 GB, an H100 fits): bench diffusion,
#                                        # 1024x1024 (SIZE=...), 16 steps (STEPS=...), c=1,4,8
#   bash scripts/gpu_run.sh fp8 [PART]   # FP8 e4m3 weights vs bf16: tests/gpu fp8 tests, then
#                                        # PART ar: Qwen3-8B shape, bench ar in-process,
#                                        # quantization none vs fp8, c=1,8,32; PART diffusion:
#                                        # Qwen-Image 20 B (random bf16, in memory), bench
#                                        # diffusion 512x512, 20 steps, c=1,8: ours-engine,
#                                        # the bare transformer, then both again with fp8
#                                        # blocks (ours-fp8); default both, the diffusion half
#                                        # with what is left of the call (short: run it alone;
#                                        # its tests and the diffusion half need the diffusers
#                                        # wheel in .whl/server, as flux)
#
# CALL_S=N: the seconds a case's time checks assume it has (default 590, one call's limit;
# lower when the case runs after others in the same call).
# Wheels the box lacks (pyzmq, msgspec, pydantic, transformers 5.24, diffusers, llguidance:
# scripts/gpu_wheels.txt) come from `bash scripts/fetch_gpu_wheels.sh` into .whl/server
# (carry it) and are installed to /tmp/site, with PyAV from .whl/media where carried.
# Models are built into /tmp/m (lost when the box is given back). Results go to $OUT (or
# ./out).
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in mixed|prefill|structured|tests|ar|fp8|ttft|step|moe|omni|omni25|thinker|core|placement|robots|pi0probe|worlds|stop|vlm|videos|qwen3tts|flux|flux2|ltx2|hunyuan_image) ;; *) sed -n "2,/^set -uo/p" "$0" | grep "^#"; sed -n "/^# usage/,/^$/p" scripts/gpu/qwen3tts.sh; exit 2 ;; esac
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
wheels=$(ls .whl/server/*.whl .whl/media/*.whl 2>/dev/null || true)
if [ -n "$wheels" ]; then
  # shellcheck disable=SC2086  # one word per wheel
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site $wheels || exit 1
else
  echo "[gpu_run] no wheels in .whl/server: bash scripts/fetch_gpu_wheels.sh, carry .whl/server"
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
t0=$(date +%s)
say() { echo "[gpu_run $(( $(date +%s) - t0 )) s] $*"; }
# reports' default tags name the card the call came on: a call that may run on an H200 often
# lands on an H100 (reports tagged h200 from an H100 had to be renamed by hand)
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 \
  | grep -oiE "h100|h200|h20|a100|l40s|b200" | head -1 | tr '[:upper:]' '[:lower:]')
card=${card:-gpu}
# the box's 64 GiB disk holds one real-size model at a time: drop the others
only_model() { mkdir -p /tmp/m; find /tmp/m -mindepth 1 -maxdepth 1 ! -name "$1" -exec rm -rf {} +; }
# bench ar, in-process, once per value of one engine option: MODEL OPTION TAG VALUE...
bench_ar_option() {
  local model=$1 option=$2 tag=$3; shift 3
  for value in "$@"; do
    # the whole log comes back in $OUT (a failure's traceback too); the summary is printed
    timeout 240 python3 -m bench ar --model "$model" --sides ours-inproc \
      --engine-option "$option=$value" --tag "$tag-$value" --out "$OUT" \
      > "$OUT/bench-ar-$tag-$value.log" 2>&1
    grep -E "^\[ar\]" "$OUT/bench-ar-$tag-$value.log" | tail -6
    grep -E "Error|error:" "$OUT/bench-ar-$tag-$value.log" | tail -3
    say "$tag $value done"
  done
}

case "${1:-}" in
  robots|pi0probe)
    only_model pi0
    [ -d /tmp/m/pi0 ] || timeout 300 python3 -c "from omni.fixtures.tiny_pi0 import build_pi0; \
build_pi0('/tmp/m/pi0', {}, dtype='bfloat16', device='cuda')" 2>&1 | tail -2
    say "model ready ($(du -sh /tmp/m/pi0 | cut -f1))"
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_pi0_cuda.py --tb=short 2>&1 | tail -8
    if [ "$1" = pi0probe ]; then
      timeout 300 python3 bench/probes/pi0_graphs.py /tmp/m/pi0 "$OUT/pi0-graphs.json" \
        > "$OUT/pi0-graphs.log" 2>&1
      grep -E "^\[pi0_graphs\]|Error|error|graphs turned off" "$OUT/pi0-graphs.log" | tail -20
      say "done"; exit 0
    fi
    timeout 360 python3 -m bench robots --model /tmp/m/pi0 --rounds 30 --concurrency 8,32 \
      --calls 5 --out "$OUT" --tag "$card" > "$OUT/bench-robots.log" 2>&1
    grep -E "^\[robots\]" "$OUT/bench-robots.log"; grep -E "Error|error" "$OUT/bench-robots.log" | tail -5
    say "robots done"
    ;;
  worlds)
    only_model cosmos3
    [ -d /tmp/m/cosmos3 ] || timeout 300 python3 -c "from omni.fixtures.tiny_cosmos3 import \
build_cosmos3; build_cosmos3('/tmp/m/cosmos3', real=True, device='cuda', dtype='bfloat16')" \
      2>&1 | tail -2
    say "model ready ($(du -sh /tmp/m/cosmos3 | cut -f1))"
    timeout 420 python3 -m bench worlds --model /tmp/m/cosmos3 --sessions 1,8 --steps 3 \
      --denoise 10 --size 256 --out "$OUT" --tag "$card" > "$OUT/bench-worlds.log" 2>&1
    grep -E "^\[worlds\]" "$OUT/bench-worlds.log"; grep -E "Error|error" "$OUT/bench-worlds.log" | tail -5
    say "worlds done"
    ;;
  qwen3tts)
    source scripts/gpu/qwen3tts.sh
    ;;
  flux|flux2)
    shape=flux1-dev; [ "$1" = flux2 ] && shape=flux2-dev
    timeout "${BENCH_TIMEOUT:-480}" python3 -m bench diffusion --shape $shape --size "${SIZE:-512x512}" \
      ${LAYERS:+--layers $LAYERS} ${HTTP_LOAD_FORMAT:+--http-load-format $HTTP_LOAD_FORMAT} --steps 20 --concurrency "${CONC:-1,4,8}" --per-client "${PER_CLIENT:-2}" \
      --sides "${SIDES:-ours-engine,diffusers-seq,diffusers-batched,transformer}" \
      --out "$OUT" --tag "${2:-$1-$card}" > "$OUT/bench-$1.log" 2>&1
    grep -E "steps/s|ms/call|wrote" "$OUT/bench-$1.log"; grep -E "Error|error" "$OUT/bench-$1.log" | tail -5
    say "$1 done"
    ;;
  hunyuan_image)
    timeout "${BENCH_TIMEOUT:-540}" python3 -m bench diffusion --shape hunyuan-image-2.1 --size "${SIZE:-1024x1024}" \
      ${LAYERS:+--layers $LAYERS} --steps "${STEPS:-16}" --concurrency "${CONC:-1,4,8}" --per-client "${PER_CLIENT:-2}" \
      --sides "${SIDES:-ours-engine,diffusers-seq,diffusers-batched,transformer}" \
      --out "$OUT" --tag "${2:-hunyuan-image-gpu}" > "$OUT/bench-hunyuan-image.log" 2>&1
    grep -E "steps/s|ms/call|wrote" "$OUT/bench-hunyuan-image.log"
    grep -E "Error|error" "$OUT/bench-hunyuan-image.log" | tail -5
    say "hunyuan_image done"
    ;;
  core)
    timeout 150 python3 bench/probes/idle_wake.py 2.5
    timeout 400 python3 -m bench core --stages 1,2,4,8 --requests 2000 --warmup 200 \
      --out "$OUT" --before bench/results/core-h200-host.json \
      --before-label "before (the previous H200-host run)" 2>&1 | grep -v "^\[core\].*requests" | tail -30
    ;;
  placement)
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_preset_devices_cuda.py \
      tests/unit/test_stage_devices.py --tb=short 2>&1 | tail -8
    timeout 120 python3 scripts/build_tiny_models.py --out /tmp/m --only qwen_image 2>&1 | tail -1
    log="$OUT/server-placement.log"
    setsid python3 -m omni.server --model /tmp/m/qwen_image --port 0 >"$log" 2>&1 &
    server=$!
    for _ in $(seq 1 240); do grep -q "listening on" "$log" && break; sleep 0.5; done
    port=$(grep -oE 'listening on http://[0-9.]+:[0-9]+' "$log" | grep -oE '[0-9]+$')
    grep -E "ready \(" "$log"
    curl -s "localhost:$port/v1/images/generations" -H 'Content-Type: application/json' \
      -d '{"model":"qwen_image","prompt":"a red cube","size":"32x32","n":1}' \
      | python3 -c 'import json,sys; d=json.load(sys.stdin); print("image bytes (b64):", len(d["data"][0]["b64_json"]))'
    kill -TERM $server; wait $server; echo "server exit $?"
    if kill -0 -$server 2>/dev/null; then echo "LEFT BEHIND:"; ps -o pid,cmd -g $server; else echo "process group empty"; fi
    ;;
  stop)
    timeout 120 python3 scripts/build_tiny_models.py --out /tmp/m --only qwen3,pi0 2>&1 | tail -1
    for model in qwen3 pi0; do
      log="$OUT/server-stop-$model.log"
      setsid python3 -m omni.server --model /tmp/m/$model --port 0 >"$log" 2>&1 &
      server=$!
      for _ in $(seq 1 240); do grep -q "listening on" "$log" && break; sleep 0.5; done
      port=$(grep -oE 'listening on http://[0-9.]+:[0-9]+' "$log" | grep -oE '[0-9]+$')
      grep -E "ready \(" "$log"
      [ "$model" = qwen3 ] && curl -s "localhost:$port/v1/completions" \
        -H 'Content-Type: application/json' -d '{"model":"qwen3","prompt":"hi","max_tokens":8}' \
        | head -c 200 && echo
      kill -TERM $server; wait $server; echo "$model: server exit $?"
      echo "$model: after 'stopping:' ->"; sed -n '/stopping: draining/,$p' "$log" | tail -n +2 | head -20
    done
    ;;
  tests)
    timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu --tb=short 2>&1 | tail -30
    timeout 60 python3 -m bench.decode_fill --device cuda --out "$OUT" 2>&1 | tail -6
    ;;
  structured)
    only_model q8
    [ -d /tmp/m/q8 ] || timeout 120 python3 scripts/build_random_model.py --shape qwen3-8b \
      --out /tmp/m/q8 --device cuda 2>&1 | tail -1
    say "model ready"
    timeout 200 python3 bench/probes/structured_decode.py --device cuda --model /tmp/m/q8 \
      --tokens 128 --rounds 3 2>&1 | tee "$OUT/structured-decode.log" | tail -8
    say "in-process done"
    timeout 200 python3 bench/probes/structured_http.py --model /tmp/m/q8 --tokens 128 \
      --rounds 3 2>&1 | tee "$OUT/structured-http.log" | tail -11
    say "http done"
    timeout 100 python3 bench/probes/grammar_mask.py --device cuda --tokenizer /tmp/m/q8 2>&1 \
      | tee "$OUT/grammar-mask.log" | tail -8
    ;;
  ar|fp8|mixed|prefill|ttft|step|moe)
    source scripts/gpu/ar.sh
    ;;
  omni|thinker)
    only_model omni
    [ -d /tmp/m/omni ] || timeout 120 python3 scripts/build_random_omni.py --out /tmp/m/omni \
      --thinker-layers 24 --device cuda 2>&1 | tail -1
    say "model ready"
    if [ "$1" = thinker ]; then
      timeout 400 python3 -m bench ar --model /tmp/m/omni --sides ours-inproc \
        --prompt-len 2500 --new-tokens 64 --concurrency "${2:-1,8,32}" --bursts "${3:-2,1,1}" \
        --tag "omni-thinker-$card" --out "$OUT" > "$OUT/bench-ar-thinker.log" 2>&1
      grep -E "^\[ar\]|Error" "$OUT/bench-ar-thinker.log" | tail -8
      say "done"; exit 0
    fi
    levels=${2:-8} sides=${3:-stream,full}
    bursts=${BURSTS:-$(echo "$levels" | sed 's/[0-9]\+/1/g')}  # default one burst per level
    timeout 480 python3 -m bench omni --model-dir /tmp/m/omni \
      --memory thinker=36GiB,talker=10GiB --prompt-tokens 2500 --thinker-tokens 900 \
      --talker-frames 450 --concurrency "$levels" --bursts "$bursts" --repeats 3 \
      --sides "$sides" --tag "${TAG:-$card-c$(echo "$levels" | tr , -)-$(echo "$sides" | tr , -)}" \
      --out "$OUT" 2>&1 | grep -E "^\[omni\]" | tail -12
    grep -h "captured the decode graph" "$OUT"/server-*.log | tail -20
    ;;
  omni25)
    only_model omni25
    # built aside and renamed: a build cut short is not taken for a model by the next call
    [ -d /tmp/m/omni25 ] || { timeout 240 python3 scripts/build_random_omni.py --family qwen2_5_omni \
      --out /tmp/m/omni25.part --thinker-layers "${LAYERS:-28}" --device cuda 2>&1 | tail -1 \
      && mv /tmp/m/omni25.part /tmp/m/omni25; }
    say "model ready ($(du -sh /tmp/m/omni25 | cut -f1))"
    levels=${2:-1,8} sides=${3:-stream,full}
    # what is left of the call's 10 minutes (the build may have taken some)
    timeout $(( ${CALL_S:-590} - $(date +%s) + t0 )) python3 -m bench omni --family qwen2_5_omni --model-dir /tmp/m/omni25 \
      --memory thinker=24GiB,talker=4GiB,token2wav=6GiB --prompt-tokens 2500 \
      --thinker-tokens 225 --talker-frames 450 --concurrency "$levels" \
      --bursts "$(echo "$levels" | sed 's/[0-9]\+/1/g')" --repeats 2 --sides "$sides" \
      --tag "${TAG:-omni25-c$(echo "$levels" | tr , -)-$(echo "$sides" | tr , -)}" \
      --out "$OUT" 2>&1 | grep -E "^\[omni\]|Error" | tail -14
    ;;
  vlm)
    only_model tiny  # the disk holds one real-size model at a time: each family's in turn
    if [ "${TESTS:-1}" != 0 ]; then  # TESTS=0: a later call on a machine that ran them
      OMNI_CACHE_DIR=/tmp/m/tiny timeout 200 python3 -m pytest -q -x -p no:cacheprovider \
        tests/unit/test_ar_vl.py tests/unit/test_whisper_hf.py tests/unit/test_vl_release.py 2>&1 | tail -3
      say "tests done"
    fi
    # a 7-8 B family: build + save ~60-90 s, the server's load, transformers' load, the
    # engine's load, two bursts a level a side (~200-280 s, guesses); whisper-large-v3 ~90 s
    for family in ${FAMILIES:-qwen2_5_vl qwen3_vl whisper_hf}; do
      if [ "$family" = whisper_hf ]; then need=90 most=150; else need=200 most=280; fi
      left=$(( ${CALL_S:-590} - $(date +%s) + t0 ))
      if [ "$left" -lt "$need" ]; then
        say "vlm $family skipped: ${left} s left; run: FAMILIES=$family bash scripts/gpu_run.sh vlm ${2:-}"
        continue
      fi
      timeout $(( left < most ? left : most )) python3 -m bench vlm --family "$family" \
        --shape release --device cuda --concurrency "${2:-1,8}" \
        --sides "${SIDES:-ours-http,ours-inproc,hf-generate}" ${LAYERS:+--layers "$LAYERS"} \
        --model-dir-out "/tmp/m/vlm-$family" --tag "${TAG:-$card}" --out "$OUT" \
        > "$OUT/bench-vlm-$family.log" 2>&1
      echo "bench vlm $family: exit $?"
      grep -E "^\[vlm\]|Error|error" "$OUT/bench-vlm-$family.log" | tail -16
      # a build cut short leaves its .building- directory beside the target
      rm -rf "/tmp/m/vlm-$family" /tmp/m/.vlm-"$family".*
      say "vlm $family done"
    done
    ;;
  videos)
    for family in ${2:-ltx_video wan22_ti2v wan22_t2v}; do
      timeout "${VIDEO_TIMEOUT:-280}" python3 -m bench videos --family "$family" --shape real \
        --size 832x480 --frames 33 --steps 8 --concurrency 1,4 ${SIDES:+--sides "$SIDES"} \
        ${HTTP_LOAD_FORMAT:+--http-load-format $HTTP_LOAD_FORMAT} --tag "${TAG:-$card}" --out "$OUT" \
        > "$OUT/bench-videos-$family.log" 2>&1
      grep -E "^\[videos\]|steps/s|Error|error" "$OUT/bench-videos-$family.log" | tail -8
      say "videos $family done"
    done
    ;;
  ltx2)
    timeout "${VIDEO_TIMEOUT:-560}" python3 -m bench videos --family ltx2 --shape real ${LAYERS:+--layers $LAYERS} \
      --size 768x512 --frames 49 --steps 8 --concurrency "${2:-1,4}" --tag "${TAG:-$card}" \
      ${SIDES:+--sides "$SIDES"} \
      --out "$OUT" > "$OUT/bench-videos-ltx2.log" 2>&1
    grep -E "^\[videos\]|steps/s|Error|error" "$OUT/bench-videos-ltx2.log" | tail -8
    ;;
esac
say "done"
