#!/usr/bin/env bash
# Run THERE (the GPU machine), from the repo root, AFTER `setup.sh install` in the same lease:
#
#   bash scripts/device/gpu_checks.sh tests    # verify + GPU/TE tests, not slow       (~2-4 min)
#   bash scripts/device/gpu_checks.sh slow     # GPU tests that train via the CLI / DeepSpeed (~5-9 min)
#   bash scripts/device/gpu_checks.sh parity   # medium BF16 vs FP8 on the bundled corpus + compare
#   bash scripts/device/gpu_checks.sh bench    # yxanul bench (time-limited) + one profile
#   bash scripts/device/gpu_checks.sh speed    # issue 22's table: BF16 and FP8 (delayed) for the default and each
#                                              # speed variant (master weights, CUDA graphs, TE loss, fused QKV,
#                                              # all stacked, chunked loss, torch.compile), one bench.json per
#                                              # variant (-> docs/bench/); SPEED_VARIANTS picks, SPEED_BUDGET caps
#   bash scripts/device/gpu_checks.sh all      # the three, in that order (mind the 600 s call limit)
#
# Everything that matters lands in $OUT (at most 8 files come back): session.log, gpu-tests.xml, gpu-slow-tests.xml,
# bench.json, bench.md, profiles.txt, parity.png, runs.tar.gz. Knobs (env): PARITY_STEPS (400),
# PARITY_MICRO (16), PARITY_SEQ (1024), PARITY_MODEL (medium), PARITY_BACKEND (te), BENCH_TIME (300 s), BENCH_PRESETS, BENCH_SEQS.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
source "$here/env.sh"
OUT="${OUT:-/tmp/yxanul-out}"
mkdir -p "$OUT"
log="$OUT/session.log"
stage="${1:-all}"
status=0

step() {  # step NAME CMD... : run, log, remember failure, keep going
  local name=$1; shift
  echo "=== $name: $*" | tee -a "$log"
  local t0; t0=$(date +%s)
  "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$log"
  # `timeout` ends pytest only: a `yxanul train` / `accelerate launch` child of a test it cut off
  # would keep the GPU busy and slow (or stall) every later step of this call
  pkill -f -- "-m yxanul train" 2>/dev/null; pkill -f -- "accelerate launch" 2>/dev/null; true
  [ "$rc" -eq 0 ] || status=1
}

tests() {
  step nvidia-smi nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  step verify python3 -m yxanul verify
  step gpu-tests timeout 560 python3 -m pytest -m "(gpu or te) and not slow" -v -p no:cacheprovider \
       --junitxml="$OUT/gpu-tests.xml"
}

slow() {  # the GPU tests that train through the CLI / accelerate launch (several runs each)
  step gpu-slow-tests timeout 570 python3 -m pytest -m "(gpu or te) and slow" -v -p no:cacheprovider \
       --junitxml="$OUT/gpu-slow-tests.xml"
}

parity() {
  local steps=${PARITY_STEPS:-400} micro=${PARITY_MICRO:-16} seq=${PARITY_SEQ:-1024}
  local common=(--model "${PARITY_MODEL:-medium}" --seq_length "$seq" --micro_batch_size "$micro" --max_steps "$steps"
                --warmup_steps 40 --max_lr 6e-4 --log_freq 5 --eval_freq 100 --eval_steps 4 --val_fraction 0.1
                --checkpoint_freq 0 --sample_tokens 0 --num_workers 2 --backend "${PARITY_BACKEND:-te}" --fp8_min_gemm_dim 0)
  rm -rf /tmp/parity && mkdir -p /tmp/parity
  step parity-bf16 python3 -m yxanul train "${common[@]}" --output_dir /tmp/parity/bf16
  step parity-fp8 python3 -m yxanul train "${common[@]}" --use_fp8 --require_fp8 --fp8_recipe delayed \
       --output_dir /tmp/parity/fp8
  step compare python3 -m yxanul compare /tmp/parity/bf16 /tmp/parity/fp8 --labels BF16,FP8-delayed \
       --tolerance 0.02 --out "$OUT/parity.png" --json
  tar czf "$OUT/runs.tar.gz" -C /tmp/parity --exclude checkpoints --exclude tensorboard bf16 fp8
}

bench() {
  step bench python3 -m yxanul bench --backend te --presets "${BENCH_PRESETS:-gpt2-124m,medium,yxanul-0.6b,xlarge}" \
       --seq_lengths "${BENCH_SEQS:-1024,2048}" --precisions bf16,fp8-delayed,fp8-current,fp8-block,fp8-mxfp8 \
       --fp8_min_gemm_dim 0 --time_limit "${BENCH_TIME:-300}" --out "$OUT"
  step profile python3 -m yxanul bench --backend te --presets medium --seq_lengths 1024 --precisions bf16,fp8-delayed \
       --fp8_min_gemm_dim 0 --steps 3 --profile --out /tmp/profile
  cat /tmp/profile/profile-*.txt > "$OUT/profiles.txt" 2>/dev/null || true
}

# issue 22's variants: name|flags (the name goes into docs/bench/YYYY-MM-DD-h100-<name>.json), most telling first
SPEED_ALL="default|
master-fp32|--master_weights fp32
graphs|--cuda_graphs
loss-te|--loss_impl te
fused-qkv|--fuse_qkv_params
stack|--loss_impl te --fuse_qkv_params --master_weights fp32 --cuda_graphs
loss-chunked|--loss_impl chunked
compile|--torch_compile"

speed() {  # every new speed path measured against today's default in ONE call (issue 22, point 5)
  local presets=${SPEED_PRESETS:-gpt2-124m,medium,xlarge} day t0 name flags; day=$(date +%F); t0=$(date +%s)
  rm -rf /tmp/speed
  local common=(--backend "${SPEED_BACKEND:-te}" --presets "$presets" --seq_lengths 1024 --precisions "bf16,fp8-delayed"
                --fp8_min_gemm_dim 0 --steps "${SPEED_STEPS:-10}" --time_limit "${SPEED_TIME:-60}")
  local wanted=",${SPEED_VARIANTS:-default,master-fp32,graphs,loss-te,fused-qkv,stack,loss-chunked,compile},"
  while IFS='|' read -r name flags; do
    [[ "$wanted" == *",$name,"* ]] || continue
    if (( $(date +%s) - t0 > ${SPEED_BUDGET:-480} )); then  # keep the whole call under the 600 s limit
      echo "=== speed-$name: not started (SPEED_BUDGET spent; rerun with SPEED_VARIANTS=$name,...)" | tee -a "$log"
      status=1; continue
    fi
    # shellcheck disable=SC2086  # $flags are flags and their values, split on purpose
    step "speed-$name" python3 -m yxanul bench "${common[@]}" $flags --out "/tmp/speed/$name"
    mkdir -p /tmp/speed/json
    cp "/tmp/speed/$name/bench.json" "/tmp/speed/json/$day-h100-$name.json" 2>/dev/null || true
    cat "/tmp/speed/$name/bench.md" >> "$OUT/speed.md" 2>/dev/null || true
  done <<< "$SPEED_ALL"
  # one archive: at most 8 files come back from a call (tar xzf speed-*.tar.gz -C docs/bench)
  tar czf "$OUT/speed-$day-h100.tar.gz" -C /tmp/speed/json . 2>/dev/null || true
}

case "$stage" in
  tests) tests ;;
  slow) slow ;;
  parity) parity ;;
  bench) bench ;;
  speed) speed ;;
  all) tests; slow; parity; bench ;;
  *) echo "unknown stage '$stage' (tests | slow | parity | bench | speed | all)" >&2; exit 2 ;;
esac
echo "=== done: status $status" | tee -a "$log"
exit "$status"
