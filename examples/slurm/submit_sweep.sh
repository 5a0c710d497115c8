#!/usr/bin/env bash
# W&B sweep agents on SLURM: an array job, one `yxanul sweep` agent per array task, with preemption /
# time-limit requeue. Create the sweep once (W&B's CLI or `yxanul sweep FILE --count 1`), then:
#
#   wandb sweep sweeps/penalty_weight_fineweb_edu.yaml     # prints ENTITY/PROJECT/SWEEP_ID
#   sbatch --array=0-4 --export=ALL,SWEEP_ID=ENTITY/PROJECT/SWEEP_ID examples/slurm/submit_sweep.sh \
#          sweeps/penalty_weight_fineweb_edu.yaml [--any_config_key value ...]
#
# Each task runs COUNT trials (default 1: five tasks = the five penalty weights of the seed's sweep).
# A trial is `accelerate launch ... train.py` as the sweep file's `command` says, in
# $OUTPUT_ROOT/sweeps/<SWEEP_ID>/<run id>/.
# Preemption: SLURM sends SIGUSR1 to this batch shell 120 s before the time limit (--signal=B:...);
# the trap forwards it to srun, srun to `yxanul sweep`, which forwards it to the trial (every rank
# checkpoints and exits 0, as in submit_fp8.sh) and stops the agent; this script then requeues the
# task, and the requeued task (same array job and task id) resumes that trial first, in the same W&B run.
#SBATCH --job-name=yxanul-sweep
#SBATCH --array=0-4
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --gpus-per-node=1
#SBATCH --cpus-per-task=16
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=logs/%x-%A_%a.out

set -euo pipefail

SWEEP_FILE=${1:-sweeps/penalty_weight_fineweb_edu.yaml}
shift || true
: "${SWEEP_ID:?set it: sbatch --export=ALL,SWEEP_ID=ENTITY/PROJECT/ID (from wandb sweep $SWEEP_FILE)}"
COUNT=${COUNT:-1}
OUTPUT_ROOT=${OUTPUT_ROOT:-runs}
TASK="${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID:-0}}_${SLURM_ARRAY_TASK_ID:-0}"
# torchrun (inside the trial's accelerate launch) forwards these signals to the ranks and waits this
# long before SIGKILL; keep it below the 120 s warning above.
export PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=100
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
export YXANUL_SWEEP_AGENT="$TASK"  # a requeued task finds its own unfinished trial by this
mkdir -p logs

echo "task $TASK: agent for sweep $SWEEP_ID ($SWEEP_FILE), $COUNT trial(s), output $OUTPUT_ROOT," \
     "restart ${SLURM_RESTART_COUNT:-0}"

PREEMPTED=0
# shellcheck disable=SC2317  # invoked by the trap, not unreachable
forward_signal() {
  PREEMPTED=1
  echo "$(date -Is) SIGUSR1: asking the trial to checkpoint and the agent to stop"
  kill -USR1 "$SRUN_PID" 2>/dev/null || true
}
trap forward_signal USR1

srun --ntasks=1 yxanul sweep "$SWEEP_FILE" --sweep_id "$SWEEP_ID" --count "$COUNT" \
  --output_root "$OUTPUT_ROOT" "$@" &
SRUN_PID=$!

# `wait` returns early when the trapped signal arrives: keep waiting until srun is gone.
RC=0
while true; do
  wait "$SRUN_PID" && RC=0 || RC=$?
  kill -0 "$SRUN_PID" 2>/dev/null || break
done

if (( PREEMPTED )); then
  JOB="${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}"
  JOB="${JOB:-$SLURM_JOB_ID}"
  echo "$(date -Is) agent exited (rc=$RC) after SIGUSR1: requeueing $JOB"
  scontrol requeue "$JOB"
  exit 0
fi
exit "$RC"
