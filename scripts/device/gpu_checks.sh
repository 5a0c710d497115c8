#!/usr/bin/env bash
# Run THERE (the GPU machine), from the repo root, AFTER `setup.sh install` in the same lease. The 15-minute
# plan (scripts/device/README.md): `setup.sh install && gpu_checks.sh first`, then `gpu_checks.sh parity profile`.
#
#   bash scripts/device/gpu_checks.sh first    # <= 7 min, each step capped: nvidia-smi + verify; the GPU/TE tests
#                                              # that are not slow, the Trainer FP8 ones (alone, ZeRO-1) first;
#                                              # the speed table: BF16 + FP8 delayed x gpt2-124m, medium, xlarge at
#                                              # seq 1024 x (default, every speed variant alone, all stacked)
#   bash scripts/device/gpu_checks.sh parity   # ~2 min: medium BF16 vs FP8 delayed, FP8 val loss at most 0.5 % above?
#   bash scripts/device/gpu_checks.sh profile  # ~1 min: per-step kernel table, host vs device, gpt2-124m + medium
#   bash scripts/device/gpu_checks.sh tests    # TESTS_FIRST (the Trainer FP8 proofs, slow ones too) first, then every
#                                              # other GPU/TE test that is not slow
#   bash scripts/device/gpu_checks.sh slow     # the other slow GPU tests (CLI trainings, DeepSpeed), if time is left
#   bash scripts/device/gpu_checks.sh bench    # every FP8 recipe x presets x seqs, if time is left
#   bash scripts/device/gpu_checks.sh speed    # the speed variants alone (FIRST_VARIANTS=... the ones `first` missed)
# Several stages may follow each other in one call (`parity profile`). Files in $OUT (a call returns <= 8):
# first: session.log, tests.xml, speed-<day>-<gpu>.tar.gz (one bench JSON per variant), summary.md;
# parity: parity.json, parity.png, runs.tar.gz; profile: profile.json, profiles.txt; tests: first-tests.xml,
# gpu-tests.xml. Here, afterwards:
# `python -m yxanul.tools.bench_table commit <the calls' folders>` puts them in docs/bench/ and regenerates
# docs/benchmarks.md's table. Knobs (env) are listed in scripts/device/README.md; the FIRST_* ones make a
# CPU rehearsal possible (tiny presets, the torch backend: the FP8 cases are skipped with their reason).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
source "$here/env.sh"
OUT="${OUT:-/tmp/yxanul-out}"
WORK="${GPU_CHECKS_WORK:-/tmp/yxanul-checks}"   # scratch; only what matters is copied to $OUT
mkdir -p "$OUT" "$WORK"
log="$OUT/session.log"
status=0
PYTEST=(python3 -m pytest -v -rfEs -p no:cacheprovider)

step() {  # step NAME CMD... : run, log, remember failure, keep going
  local name=$1; shift
  echo "=== $name: $*" | tee -a "$log"
  local t0=$SECONDS
  # not `| tee`: a leftover that keeps the pipe open would hold the step until it ends, before reap could run
  YX_CHECKS_STEP="$$-$name" "$@" > >(tee -a "$log") 2>&1
  local rc=$?
  echo "=== $name: exit $rc after $(( SECONDS - t0 )) s" | tee -a "$log"
  reap "$$-$name"
  [ "$rc" -eq 0 ] || status=1
}

reap() {  # end what a step left running, and only that: processes that inherited its YX_CHECKS_STEP marker
  # (`timeout` ends its own process group; a test's `accelerate launch` runs in a session of its own and a
  # worker left on the GPU would slow or stall every later step). On the device only (nvidia-smi there):
  # a CPU rehearsal on a shared machine neither needs it nor reads other processes' environments.
  [ "${GPU_CHECKS_REAP:-$(command -v nvidia-smi >/dev/null && echo 1)}" = 1 ] || return 0
  local f pid
  grep -lzx "YX_CHECKS_STEP=$1" /proc/[0-9]*/environ 2>/dev/null | while IFS= read -r f; do
    pid=${f#/proc/}; pid=${pid%/environ}
    [ "$pid" != "$$" ] && kill -9 "$pid" 2>/dev/null && echo "=== reaped $pid (left by step $1)" | tee -a "$log"
  done
  true
}

# shellcheck disable=SC2317  # called through step's "$@"

capped() {  # capped SECONDS CMD... : SIGINT at the cap (pytest then still writes its junit, bench its JSON)
  local s=$1; shift
  timeout -s INT -k 20 "$s" "$@"
}

variant_flags() {  # the yxanul bench flags of a speed variant (one table: yxanul/tools/bench_table.py)
  python3 -c "import sys; from yxanul.tools.bench_table import VARIANTS as V; print(V[sys.argv[1]])" "$1"
}

speed_variants() {  # speed_variants SECONDS: FIRST_VARIANTS in order, each one `yxanul bench` with a fair share
  local budget=$1 s0=$SECONDS name flags left share n
  local -a names
  local order=default,master-fp32,loss-te,graphs,stack,stack-no-masters,stack-rope,rope-masters,wgrad-masters,triton-rope,cudnn-norm,ratio-stack,rope-norm,rope-norm-attn,fp8-attention,fused-qkv,fused-rope,loss-chunked,compile,plain
  IFS=, read -r -a names <<< "${FIRST_VARIANTS:-$order}"
  local presets=${FIRST_PRESETS:-gpt2-124m,medium,xlarge} precisions=bf16,fp8-delayed
  local common=(--backend "${FIRST_BACKEND:-te}" --presets "$presets"
                --seq_lengths "${FIRST_SEQ:-1024}" --precisions "$precisions" --fp8_min_gemm_dim 0
                --tokens_per_micro "${FIRST_TOKENS:-16384}" --vocab_size "${FIRST_VOCAB:-50257}"
                --warmup "${FIRST_WARMUP:-1}" --steps "${FIRST_STEPS:-5}"
                --gradient_accumulation_steps "${FIRST_ACCUM:-1}")
  n=${#names[@]}
  for name in "${names[@]}"; do
    left=$(( budget - (SECONDS - s0) ))
    if (( left < 15 )); then
      echo "=== speed-$name: not started (budget spent; next call: FIRST_VARIANTS=$name,... gpu_checks.sh speed)" \
        | tee -a "$log"; status=1; n=$(( n - 1 )); continue
    fi
    share=$(( left / n )); n=$(( n - 1 ))
    flags=$(variant_flags "$name") || { echo "=== speed-$name: unknown variant" | tee -a "$log"; status=1; continue; }
    # --time_limit: no new case after its share; the cap: a hang (graph capture, compile) ends at 2 shares
    # shellcheck disable=SC2086  # $flags are flags and their values, split on purpose
    step "speed-$name" capped "$(( share * 2 < left ? share * 2 : left ))" python3 -m yxanul bench "${common[@]}" \
      $flags --time_limit "$share" --out "$WORK/speed/$name"
  done
  step pack python3 -m yxanul.tools.bench_table pack "$WORK/speed" --out "$OUT"
}

tests_step() {  # tests_step NAME T0 CMD...: a step capped at what FIRST_TESTS_S leaves since T0, or 'not started'
  local name=$1 t0=$2 left; shift 2
  left=$(( ${FIRST_TESTS_S:-150} - (SECONDS - t0) ))
  if (( left >= 10 )); then
    step "$name" capped "$left" "$@"
  else
    echo "=== $name: not started (FIRST_TESTS_S spent; later: gpu_checks.sh tests)" | tee -a "$log"; status=1
  fi
}

# one call, <= FIRST_BUDGET (400 s) in all (a capped step may end up to 20 s past its cap, by SIGKILL);
# the order is the priority
first() {
  local t0=$SECONDS tests_t0 left
  rm -rf "$WORK/speed" "$WORK"/*.xml
  step nvidia-smi capped 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  step verify capped 60 python3 -m yxanul verify
  tests_t0=$SECONDS
  step trainer-gpu-tests capped "${FIRST_TRAINER_S:-100}" "${PYTEST[@]}" tests/integrations/test_trainer_gpu.py \
    -m "gpu or te" --junitxml="$WORK/trainer.xml"
  tests_step gpu-tests "$tests_t0" "${PYTEST[@]}" -m "(gpu or te) and not slow" \
    --ignore=tests/integrations/test_trainer_gpu.py --ignore=tests/integrations/test_trl_fp8_gpu.py \
    --junitxml="$WORK/gpu.xml"
  # TRL under FP8 last: the newest, the least central
  tests_step trl-gpu-tests "$tests_t0" "${PYTEST[@]}" tests/integrations/test_trl_fp8_gpu.py -m "gpu or te" \
    --junitxml="$WORK/trl.xml"
  step junit python3 -m yxanul.tools.bench_table junit "$WORK/trainer.xml" "$WORK/gpu.xml" "$WORK/trl.xml" \
    --out "$OUT/tests.xml"
  left=$(( ${FIRST_BUDGET:-400} - (SECONDS - t0) - 10 ))
  speed_variants "$(( left < ${FIRST_SPEED_S:-240} ? left : ${FIRST_SPEED_S:-240} ))"
  { echo; echo "Steps of this call (exit code, seconds):"
    grep -E '^=== .*(exit [0-9]+ after|not started|reaped)' "$log"; } >> "$OUT/summary.md"
  cat "$OUT/summary.md"  # the end of the output comes back in the tool's reply
}

parity() {  # shortened: PARITY_STEPS (250) of medium, BF16 then FP8 delayed, FP8 val loss at most 0.5 % above?
  local steps=${PARITY_STEPS:-250} micro=${PARITY_MICRO:-16} seq=${PARITY_SEQ:-1024} cap=${PARITY_CAP_S:-100}
  local model=${PARITY_MODEL:-medium} flags=${PARITY_FLAGS:-}
  local common=(--model "$model" --seq_length "$seq" --micro_batch_size "$micro" --max_steps "$steps"
                --warmup_steps "$(( steps / 5 < 40 ? steps / 5 : 40 ))" --max_lr 6e-4 --log_freq 5
                --eval_freq "$(( steps / 2 ))" --eval_steps 4
                --val_fraction 0.1 --checkpoint_freq 0 --sample_tokens 0 --num_workers 2
                --backend "${PARITY_BACKEND:-te}" --fp8_min_gemm_dim 0)
  rm -rf "$WORK/parity" && mkdir -p "$WORK/parity"
  # shellcheck disable=SC2086  # $flags are flags and their values, split on purpose
  step parity-bf16 capped "$cap" python3 -m yxanul train "${common[@]}" $flags --output_dir "$WORK/parity/bf16"
  # shellcheck disable=SC2086
  step parity-fp8 capped "$cap" python3 -m yxanul train "${common[@]}" $flags --use_fp8 --require_fp8 \
    --fp8_recipe delayed --output_dir "$WORK/parity/fp8"
  step compare python3 -m yxanul compare "$WORK/parity/bf16" "$WORK/parity/fp8" --labels BF16,FP8-delayed \
    --tolerance 0.02 --out "$OUT/parity.png"
  step parity-check python3 -m yxanul.tools.bench_decide --parity_runs "$WORK/parity/bf16,$WORK/parity/fp8" \
    --parity_model "$model" --parity_flags "$flags" --parity_out "$OUT/parity.json"
  tar czf "$OUT/runs.tar.gz" -C "$WORK/parity" --exclude checkpoints --exclude tensorboard bf16 fp8 2>/dev/null
}

profile() {  # where a step's time goes: 3 profiled steps per case (kernel table, host vs device time)
  rm -rf "$WORK/profile"
  # shellcheck disable=SC2086  # $PROFILE_FLAGS are flags and their values, split on purpose
  step profile capped "${PROFILE_CAP_S:-80}" python3 -m yxanul bench --backend "${FIRST_BACKEND:-te}" \
    --presets "${PROFILE_PRESETS:-gpt2-124m,medium}" --seq_lengths "${FIRST_SEQ:-1024}" --precisions bf16,fp8-delayed \
    --fp8_min_gemm_dim 0 --tokens_per_micro "${FIRST_TOKENS:-16384}" --vocab_size "${FIRST_VOCAB:-50257}" \
    --warmup 2 --steps 3 --profile ${PROFILE_FLAGS:-} --out "$WORK/profile"
  cp "$WORK/profile/bench.json" "$OUT/profile.json" 2>/dev/null
  cat "$WORK/profile"/profile-*.txt > "$OUT/profiles.txt" 2>/dev/null || true
}

tests() {  # TESTS_FIRST (paths / node ids, slow ones included: the proofs the issues wait for), then every other
  # GPU/TE test that is not slow; TESTS_ARGS: more pytest arguments for the second (e.g. --deselect)
  local first=() skip=() t
  read -r -a first <<< "${TESTS_FIRST:-tests/integrations/test_trainer_gpu.py}"  # split, never globbed ([params])
  for t in "${first[@]}"; do skip+=(--deselect "$t"); done
  step nvidia-smi nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  step verify python3 -m yxanul verify
  step first-gpu-tests capped "${TESTS_FIRST_S:-200}" "${PYTEST[@]}" "${first[@]}" -m "gpu or te" \
    --junitxml="$OUT/first-tests.xml"
  # shellcheck disable=SC2086  # $TESTS_ARGS are pytest arguments, split on purpose
  step gpu-tests capped "${TESTS_CAP_S:-560}" "${PYTEST[@]}" -m "(gpu or te) and not slow" "${skip[@]}" \
    ${TESTS_ARGS:-} --junitxml="$OUT/gpu-tests.xml"
}

slow() {  # the GPU tests that train through the CLI / accelerate launch (several runs each)
  step gpu-slow-tests capped 570 "${PYTEST[@]}" -m "(gpu or te) and slow" \
    --ignore=tests/integrations/test_trainer_gpu.py --junitxml="$OUT/gpu-slow-tests.xml"
}

bench() {  # every FP8 recipe TE allows, against BF16
  step bench capped "$(( ${BENCH_TIME:-300} + 120 ))" python3 -m yxanul bench --backend te \
    --presets "${BENCH_PRESETS:-gpt2-124m,medium,yxanul-0.6b,xlarge}" --seq_lengths "${BENCH_SEQS:-1024,2048}" \
    --precisions bf16,fp8-delayed,fp8-current,fp8-block,fp8-mxfp8 --fp8_min_gemm_dim 0 \
    --time_limit "${BENCH_TIME:-300}" --out "$OUT"
}

[ $# -gt 0 ] || set -- first
for stage in "$@"; do
  case "$stage" in
    first) first ;;
    parity) parity ;;
    profile) profile ;;
    tests) tests ;;
    slow) slow ;;
    bench) bench ;;
    speed) rm -rf "$WORK/speed"; speed_variants "${SPEED_BUDGET:-480}" ;;
    *) echo "unknown stage '$stage' (first | parity | profile | tests | slow | bench | speed)" >&2; exit 2 ;;
  esac
done
echo "=== done: status $status" | tee -a "$log"
exit "$status"
