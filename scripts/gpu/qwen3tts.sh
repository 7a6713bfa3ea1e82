# bash scripts/gpu_run.sh qwen3tts [PARTS]: the Qwen3-TTS case of gpu_run.sh (the usage
# below), sourced by it: its variables (OUT, card, t0), functions (say,
# only_model) and positional parameters are the dispatcher's. A file of its own so that
# each script stays readable (the house keeps files under ~400 lines).

# usage
#   bash scripts/gpu_run.sh qwen3tts [P] # Qwen3-TTS-12Hz-1.7B's shapes (random bf16, built on the
#                                        # GPU; MODEL=DIR a CustomVoice release, BASE_MODEL=DIR a
#                                        # Base one): fused stage in the qwen3-tts environment
#                                        # over the box's python3, offline from .whl/qwen3-tts
#                                        # (bash scripts/fetch_gpu_wheels.sh; carry .whl/server,
#                                        # .whl/qwen3-tts, .whl/tools for spy); parts P
#                                        # (default step,stream,stagger,whole,clone; ar: the
#                                        # talker on the AR engine, c=1,8,64; arplain: the same,
#                                        # the code2wav stage's calls unpadded (fixed_shapes
#                                        # off; AR_BURSTS=2,2,2: bursts a level); ar25: the
#                                        # AR layout with the former 25-frame code2wav chunks
#                                        # (the preset's are 50: run "ar,ar25"); arkv: the
#                                        # AR layout, predictor_kv_cache on; arlayer: predictor
#                                        # layer steps compiled one by one; arwhole:
#                                        # the AR layout, each request decoded once after its
#                                        # last frame (the talker's steps alone on the GPU;
#                                        # each level's steps a stage are in the report); spy with
#                                        # SPY_LAYOUT=ar [SPY_C=N]
#                                        # samples the AR talker; decoder: the Code2Wav
#                                        # decoder alone, eager vs fused SnakeBeta vs a
#                                        # compiled conv stack (bench/probes/
#                                        # qwen3_tts_decoder.py); colocate: the talker's
#                                        # steps beside decodes in its own process vs another
#                                        # (bench/probes/qwen3_tts_colocate.py, B=64 then 8:
#                                        # COLOCATE_BATCH); predictor: the code
#                                        # predictor's graphs uncached vs KV-cached (bench/
#                                        # probes/qwen3_tts_predictor.py; PREDICTOR_ARGS,
#                                        # e.g. "--profile 8"); arstep: the AR talker's step
#                                        # in-process, bench/probes/qwen3_tts_ar_step.py; arequal:
#                                        # its greedy codes vs qwen-tts's, float32, tiny release,
#                                        # bench/probes/qwen3_tts_ar_equal.py): step: where
#                                        # a streamed step's time goes, the predictor's graphs
#                                        # off and on (bench/probes/qwen3_tts_step.py); bench qwen3_tts
#                                        # c=1,8,64 streamed within sentences, 64 staggered
#                                        # arrivals (bench/probes/qwen3_tts_stagger.py), c=1,8 sentences whole
#                                        # (--chunk-frames 0), c=1,8 voice clone (Base; needs
#                                        # PyAV, fetch set media: with it, .whl/server and
#                                        # .whl/qwen3-tts pass the 64 MiB a call carries,
#                                        # even with transformers, diffusers, llguidance and
#                                        # the duplicate pyzmq/msgspec out of .whl/server
#                                        # (66.5 MB with the tree: refused, session 14); so
#                                        # carry .whl/media alone in a short first call: an
#                                        # ignored path stays on the machine while it is
#                                        # warm, so a clone call right after it finds
#                                        # .whl/media there; untried); spy (not in the
#                                        # default): the c=8 burst with py-spy sampling the
#                                        # stage's engine process (qwen3-tts-spy.txt); 100
#                                        # frames (8 s) a request; a part that the call's time
#                                        # cannot hold is skipped, saying so (run it alone);
#                                        # TAG=... names the reports (default: the card,
#                                        # h100 or h200)

    only_model qwen3tts
    # the stage environment: the box's python3 and its CUDA torch, plus the wheels it lacks
    export OMNI_ENVS_DIR=/tmp/envs OMNI_CACHE_DIR=/tmp/m/qwen3tts
    if ! timeout 120 bash scripts/install_qwen3_tts_gpu_env.sh .whl/qwen3-tts >/tmp/env.log 2>&1; then
      tail -20 /tmp/env.log; say "no qwen3-tts environment (above)"; exit 1
    fi
    grep "^install_qwen3_tts_gpu_env" /tmp/env.log
    say "environment ready"
    parts=${2:-step,stream,stagger,whole,clone}
    # where a streamed step's time goes, the code predictor's graphs off and on
    if [[ ,$parts, == *,step,* ]]; then
      model=$(python3 -c "from bench.qwen3_tts import fixture_dir; print(fixture_dir('', False, '${SHAPE:-release}'))" | tail -1)
      for how in "" --staggered; do
        timeout 150 /tmp/envs/qwen3-tts/bin/python bench/probes/qwen3_tts_step.py --model "$model" \
          --batch 1,8,64 $how 2>&1 | tee -a "$OUT/qwen3-tts-step.md" | grep "^|"
      done
      say "step done"
    fi
    # the AR talker's fast path (graphs, compiled predictor layers) against qwen-tts's own
    # greedy codes, float32, on the tiny release
    if [[ ,$parts, == *,arequal,* ]]; then
      model=$(python3 -c "from bench.qwen3_tts import fixture_dir; print(fixture_dir('', False, 'tiny'))" | tail -1)
      timeout 240 /tmp/envs/qwen3-tts/bin/python bench/probes/qwen3_tts_ar_equal.py --model "$model" \
        --device cuda 2>&1 | tee "$OUT/qwen3-tts-ar-equal.log" | grep -E "qwen3_tts_ar_equal|Error"
      say "arequal done"
    fi
    # the Code2Wav decoder alone: eager vs fused SnakeBeta vs a compiled conv stack
    if [[ ,$parts, == *,decoder,* ]]; then
      timeout 300 /tmp/envs/qwen3-tts/bin/python bench/probes/qwen3_tts_decoder.py \
        --batch 8,64 --frames 28,75 2>&1 | tee "$OUT/qwen3-tts-decoder.md" | grep -E "^\||fused|Error"
      say "decoder done"
    fi
    # the AR talker's decode step in-process: the code predictor vs the rest
    if [[ ,$parts, == *,arstep,* ]]; then
      model=$(python3 -c "from bench.qwen3_tts import fixture_dir; print(fixture_dir('', False, '${SHAPE:-release}'))" | tail -1)
      timeout 300 /tmp/envs/qwen3-tts/bin/python bench/probes/qwen3_tts_ar_step.py --model "$model" \
        --batch 1,8,64 ${ARSTEP_ARGS:-} 2>&1 | tee -a "$OUT/qwen3-tts-ar-step.md" | grep -E "^\||^\(profile|Error"
      say "arstep done"
    fi
    # the code predictor's captured loop alone: uncached vs KV-cached, layers eager vs compiled
    if [[ ,$parts, == *,predictor,* ]]; then
      model=$(python3 -c "from bench.qwen3_tts import fixture_dir; print(fixture_dir('', False, '${SHAPE:-release}'))" | tail -1)
      timeout 300 /tmp/envs/qwen3-tts/bin/python bench/probes/qwen3_tts_predictor.py --model "$model" \
        ${PREDICTOR_ARGS:-} 2>&1 | tee -a "$OUT/qwen3-tts-predictor.md" | grep -E "^\||^\(|Error|failed"
      say "predictor done"
    fi
    # the talker's steps beside Code2Wav decodes in a thread of its process (own stream,
    # with and without a high-priority talker stream) vs in another process (as served)
    if [[ ,$parts, == *,colocate,* ]]; then
      model=$(python3 -c "from bench.qwen3_tts import fixture_dir; print(fixture_dir('', False, '${SHAPE:-release}'))" | tail -1)
      for b in ${COLOCATE_BATCH:-64 8}; do
        timeout 240 /tmp/envs/qwen3-tts/bin/python bench/probes/qwen3_tts_colocate.py \
          --model "$model" --batch "$b" 2>&1 | tee -a "$OUT/qwen3-tts-colocate.md" | grep -E "^\||^B=|Error"
      done
      say "colocate done"
    fi
    # each part: a server start (~40 s), a model build the first time (~40 s, guess) and
    # 3-5 bursts of 100 frames (~15 s each at ~130 ms a frame, eager; guess)
    qwen3tts_part() {  # PART NEED_S TAG BENCH_ARGS...
      local part=$1 need=$2 tag=$3 left; shift 3
      [[ ,$parts, == *,$part,* ]] || return 0
      left=$(( ${CALL_S:-590} - $(date +%s) + t0 ))
      if [ "$left" -lt "$need" ]; then
        say "$part skipped: ${left} s left; run: bash scripts/gpu_run.sh qwen3tts $part"; return 0
      fi
      # the parts' logs in one file ($OUT brings back 8 files: 3 reports, 3 server logs)
      timeout "$left" python3 -m bench qwen3_tts "$@" --frames 100 --out "$OUT" --tag "$tag" \
        > "/tmp/bench-$part.log" 2>&1
      { echo "== $part"; tail -40 "/tmp/bench-$part.log"; } >> "$OUT/bench-qwen3-tts.log"
      grep -E "^\[qwen3_tts\]" "/tmp/bench-$part.log"
      grep -E "Error|error" "/tmp/bench-$part.log" | tail -5
      say "$part done"
    }
    # SHAPE=tiny: the tiny fixture (a dry run of this case on any machine)
    custom=(--shape "${SHAPE:-release}"); [ -n "${MODEL:-}" ] && custom=(--model "$MODEL")
    base=(--shape "${SHAPE:-release}"); [ -n "${BASE_MODEL:-}" ] && base=(--model "$BASE_MODEL")
    qwen3tts_part stream 150 "${TAG:-$card}" "${custom[@]}" --concurrency 1,8,64 --bursts 2,1,1
    # the talker on the AR engine (paged KV, decode graphs) -> a code2wav stage
    qwen3tts_part ar 150 "${TAG:-$card}-ar" "${custom[@]}" --layout ar --concurrency 1,8,64 \
      --bursts "${AR_BURSTS:-2,1,1}"
    # the same with the predictor's layer steps compiled one by one (the preset compiles
    # each pass whole), beside "ar"
    qwen3tts_part arlayer 150 "${TAG:-$card}-ar-layer" "${custom[@]}" --layout ar \
      --concurrency 1,8,64 --talker-option predictor_compile_unit=layer --bursts "${AR_BURSTS:-2,1,1}"
    # the same with the code predictor over its static KV cache (predictor_kv.py), beside "ar"
    qwen3tts_part arkv 150 "${TAG:-$card}-ar-kv" "${custom[@]}" --layout ar --concurrency 1,8,64 \
      --talker-option predictor_kv_cache=true --bursts "${AR_BURSTS:-2,1,1}"
    # the same with each request's audio decoded once, after its last frame: the talker's
    # served steps without the code2wav stage's decodes beside them on the GPU
    qwen3tts_part arwhole 150 "${TAG:-$card}-ar-whole" "${custom[@]}" --layout ar \
      --chunk-frames 100 --code2wav-option first_chunk_frames=100 --concurrency 1,8,64 \
      --bursts "${AR_BURSTS:-2,1,1}"
    # the same with the code2wav stage's calls unpadded (each new shape met while serving)
    qwen3tts_part arplain 150 "${TAG:-$card}-ar-plain" "${custom[@]}" --layout ar \
      --code2wav-option fixed_shapes=false --concurrency 1,8,64 --bursts "${AR_BURSTS:-2,1,1}"
    # the former 25-frame code2wav chunks (the preset streams 50), beside "ar" in one call
    qwen3tts_part ar25 150 "${TAG:-$card}-ar-chunk25" "${custom[@]}" --layout ar \
      --chunk-frames 25 --concurrency 1,8,64 --bursts "${AR_BURSTS:-2,1,1}"
    # 64 staggered arrivals (continuous batching): late requests' first audio
    left=$(( ${CALL_S:-590} - $(date +%s) + t0 ))
    if [[ ,$parts, == *,stagger,* ]] && [ "$left" -gt 120 ]; then
      stagger_model=(--shape "${SHAPE:-release}"); [ -n "${MODEL:-}" ] && stagger_model=(--model "$MODEL")
      timeout 150 python3 bench/probes/qwen3_tts_stagger.py "${stagger_model[@]}" \
        --concurrency 64 --frames 100 --out "$OUT/qwen3-tts-stagger.json" 2>&1 | tail -2
      say "stagger done"
    fi
    # each sentence sent whole (no streaming within it): TTFP and audio-s/s
    qwen3tts_part whole 100 "${TAG:-$card}-whole" "${custom[@]}" --concurrency 1,8 --bursts 1,1 \
      --chunk-frames 0
    # the c=8 burst with py-spy sampling the stage's engine process: where the served steps
    # lose time against the probe's (bench/results/qwen3-tts-gpu.md)
    if [[ ,$parts, == *,spy,* ]]; then
      python3 -m pip install -q --no-index --no-deps --target /tmp/spy .whl/tools/py_spy-*.whl \
        || say "spy: no py-spy wheel in .whl/tools (fetch set tools)"
      spylog="$OUT/qwen3-tts-spy-server.log"
      # SPY_LAYOUT=ar: the AR talker's engine process (SPY_C: the burst size, default 8);
      # SPY_STAGES="talker code2wav": one recorder per stage, qwen3-tts-spy-STAGE.txt each
      spy_stages=${SPY_STAGES:-tts}; spy_args=()
      [ "${SPY_LAYOUT:-fused}" = ar ] && spy_stages=${SPY_STAGES:-talker} && spy_args=(--layout ar)
      rm -f /tmp/spy.started
      spy_pids=()
      for spy_stage in $spy_stages; do
        (
          pid=""
          for _ in $(seq 600); do
            pid=$(grep -oE "replica $spy_stage/0 ready \(pid [0-9]+" "$spylog" 2>/dev/null | grep -oE "[0-9]+$")
            [ -n "$pid" ] && break; sleep 0.5
          done
          [ -n "$pid" ] || exit 0
          sleep "${SPY_WAIT:-15}"  # past the warm-up request: into the bursts
          touch /tmp/spy.started
          exec /tmp/spy/bin/py-spy record --pid "$pid" --duration 30 --rate 100 --idle \
            --format raw -o "$OUT/qwen3-tts-spy-$spy_stage.txt" > "/tmp/spy-$spy_stage.log" 2>&1
        ) &
        spy_pids+=($!)
      done
      qwen3tts_part spy 150 spy "${custom[@]}" "${spy_args[@]}" --concurrency "${SPY_C:-8}" \
        --bursts "${SPY_BURSTS:-3}"
      # the bench is over: a waiter still looking for the engine stops here, so a server
      # that never started costs no wait; a running py-spy ends with the engine by itself
      [ -e /tmp/spy.started ] || kill "${spy_pids[@]}" 2>/dev/null
      wait "${spy_pids[@]}" 2>/dev/null; tail -n 3 /tmp/spy-*.log 2>/dev/null
    fi
    # voice clone (Base, every request with one reference clip)
    qwen3tts_part clone 140 "${TAG:-$card}-clone" --clone "${base[@]}" --concurrency 1,8 --bursts 1,1
    say "qwen3tts done"
