# bash scripts/gpu_run.sh ar|fp8|mixed|prefill|ttft|step|moe: the Qwen3-8B-shape (and
# 30B-A3B) AR cases of gpu_run.sh (its usage text says what each runs), sourced by it: its
# variables (OUT, card, t0), functions (say, only_model, bench_ar_option) and positional
# parameters are the dispatcher's.

case "$1" in
  ar)
    only_model q8
    [ -d /tmp/m/q8 ] || timeout 120 python3 scripts/build_random_model.py --shape qwen3-8b \
      --out /tmp/m/q8 --device cuda 2>&1 | tail -1
    say "model ready"
    bench_ar_option /tmp/m/q8 fuse_projections "qwen3-8b-${2:-$card}-fuse" ${VALUES:-false true}
    ;;
  fp8)
    part=${2:-both}
    OMNI_CACHE_DIR=/tmp/m/tiny timeout 150 python3 -m pytest -q -x -p no:cacheprovider \
      tests/gpu/test_fp8_cuda.py tests/gpu/test_fp8_diffusion_cuda.py 2>&1 | tail -3
    if [ "$part" != diffusion ]; then
      only_model q8
      [ -d /tmp/m/q8 ] || timeout 120 python3 scripts/build_random_model.py --shape qwen3-8b \
        --out /tmp/m/q8 --device cuda 2>&1 | tail -1
      say "model ready"
      bench_ar_option /tmp/m/q8 quantization "qwen3-8b-${TAG:-$card}-fp8" none fp8
    fi
    left=$(( ${CALL_S:-590} - $(date +%s) + t0 ))  # Qwen-Image's build and bench need ~3 min (guess)
    if [ "$part" != ar ] && [ "$left" -lt 180 ]; then
      say "diffusion half skipped: ${left} s left; run: bash scripts/gpu_run.sh fp8 diffusion"
    elif [ "$part" != ar ]; then
      timeout "$left" python3 -m bench diffusion --shape qwen-image \
        --size 512x512 --steps 20 --concurrency 1,8 --per-client 2 \
        --sides ours-engine,transformer,ours-fp8 --out "$OUT" --tag "qwen-image-${TAG:-$card}-fp8" \
        > "$OUT/bench-diffusion-fp8.log" 2>&1
      grep -E "steps/s|ms/call|fp8|wrote" "$OUT/bench-diffusion-fp8.log"
      grep -E "Error|error" "$OUT/bench-diffusion-fp8.log" | tail -5
      say "diffusion fp8 done"
    fi
    ;;
  mixed)
    only_model q8
    [ -d /tmp/m/q8 ] || timeout 120 python3 scripts/build_random_model.py --shape qwen3-8b \
      --out /tmp/m/q8 --device cuda 2>&1 | tail -1
    say "model ready"
    timeout 240 python3 bench/probes/mixed_load.py --model /tmp/m/q8 --label "8192 a step" \
      --engine-option prefill_beside_decodes=8192 --out "$OUT/mixed.jsonl" 2>&1 | tail -4
    say "before done"
    timeout 240 python3 bench/probes/mixed_load.py --model /tmp/m/q8 --label "step budget" \
      --out "$OUT/mixed.jsonl" 2>&1 | tail -4
    ;;
  prefill)
    only_model q8
    [ -d /tmp/m/q8 ] || timeout 120 python3 scripts/build_random_model.py --shape qwen3-8b \
      --out /tmp/m/q8 --device cuda 2>&1 | tail -1
    say "model ready"
    len=${2:-2048}
    timeout 120 python3 bench/probes/prefill_ceiling.py "$OUT/prefill-ceiling.json" 2>&1 | tail -6
    for kernel in sdpa varlen; do
      timeout 240 python3 -m bench ar --model /tmp/m/q8 --sides ours-http --concurrency 8 \
        --bursts 3 --prompt-len "$len" --new-tokens 8 --engine-option prefill_attention=$kernel \
        --tag "prefill-$len-$kernel" --out "$OUT" > "$OUT/bench-prefill-$len-$kernel.log" 2>&1
      grep -E "^\[ar\]|Error" "$OUT/bench-prefill-$len-$kernel.log" | tail -4
      grep -hE "slow step" "$OUT"/ar-prefill-$len-$kernel-*server.log | tail -3
      say "$kernel done"
    done
    ;;
  ttft)
    only_model q8
    [ -d /tmp/m/q8 ] || timeout 120 python3 scripts/build_random_model.py --shape qwen3-8b \
      --out /tmp/m/q8 --device cuda 2>&1 | tail -1
    say "model ready"
    timeout 420 python3 -m bench ar --model /tmp/m/q8 --sides ours-http --concurrency 1,8,32 \
      --bursts 3,3,3 --prompt-len 128 --new-tokens 256 --tag "qwen3-8b-${2:-$card}-ttft-http" \
      --out "$OUT" > "$OUT/bench-ar-ttft.log" 2>&1
    grep -E "^\[ar\]|Error" "$OUT/bench-ar-ttft.log" | tail -8
    grep -hE "slow step|decode graphs hold|captured the decode graph|ready" "$OUT"/*server.log | tail -20
    ;;
  step)
    only_model q8
    [ -d /tmp/m/q8 ] || timeout 120 python3 scripts/build_random_model.py --shape qwen3-8b \
      --out /tmp/m/q8 --device cuda 2>&1 | tail -1
    timeout 240 python3 -m bench.ar_step --model /tmp/m/q8 --device cuda --batch 1,32 \
      --kernels 20 --modes "${MODES:-off,on,chain}" --engine-option attention_kernel=triton \
      --engine-option max_graph_context=512 \
      --tag "qwen3-8b-${2:-$card}" --out "$OUT" 2>&1 | grep "^\[ar_step\]"
    ;;
  moe)
    only_model q30
    [ -d /tmp/m/q30 ] || timeout 120 python3 scripts/build_random_model.py --shape qwen3-30b-a3b \
      --layers 12 --out /tmp/m/q30 --device cuda 2>&1 | tail -1
    say "model ready"
    bench_ar_option /tmp/m/q30 fuse_projections "qwen3-30b-a3b-${2:-$card}-fuse" false true
    ;;
esac
