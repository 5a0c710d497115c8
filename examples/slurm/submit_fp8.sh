#!/usr/bin/env bash
# yxanul FP8 pretraining on SLURM, one node or many, with preemption / time-limit requeue.
#
#   sbatch examples/slurm/submit_fp8.sh examples/configs/xlarge_8gpu_fp8.yaml            # 1 node x 8 GPUs
#   sbatch --nodes=4 examples/slurm/submit_fp8.sh examples/configs/xlarge_8gpu_fp8.yaml  # 4 nodes
#   sbatch --export=ALL,CONFIG=examples/configs/fineweb_edu_fp8.yaml examples/slurm/submit_fp8.sh  # the same
#   ACCEL_CONFIG=accelerate_configs/deepspeed_zero1_fp8.yaml sbatch examples/slurm/submit_fp8.sh CONFIG
#   ACCEL_CONFIG=accelerate_configs/fsdp2.yaml sbatch --nodes=2 examples/slurm/submit_fp8.sh CONFIG       # FSDP2
#   ACCEL_CONFIG=accelerate_configs/fsdp2_hsdp.yaml sbatch --nodes=2 examples/slurm/submit_fp8.sh CONFIG  # HSDP
#
# Preemption: SLURM sends SIGUSR1 to this batch shell 120 s before the time limit (--signal=B:...).
# The trap forwards it to srun, srun to `accelerate launch` (which is torchrun's agent), and the agent
# forwards it to every training process because PET_SIGNALS_TO_HANDLE lists SIGUSR1 (without that,
# SIGUSR1 kills the agent and orphans the workers: checked on CPU, see docs/distributed.md).
# yxanul's trainer finishes the step, saves a checkpoint and exits 0; then this script requeues the
# job, and the requeued job resumes with --resume auto (the first start finds no checkpoint and starts fresh).
#SBATCH --job-name=yxanul-fp8
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=logs/%x-%j.out

set -euo pipefail

CONFIG=${1:-${CONFIG:-examples/configs/xlarge_8gpu_fp8.yaml}}  # the argument, else sbatch --export=ALL,CONFIG=...
shift || true
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NNODES=${SLURM_NNODES:-1}
MASTER_PORT=${MASTER_PORT:-29500}
# Same directory after a requeue (same job id), so --resume auto finds the checkpoint.
OUTPUT_DIR=${OUTPUT_DIR:-runs/${SLURM_JOB_NAME:-yxanul}-${SLURM_JOB_ID}}
if [[ -z "${ACCEL_CONFIG:-}" ]]; then
  if (( NNODES > 1 )); then ACCEL_CONFIG=accelerate_configs/multi_node_fp8.yaml
  else ACCEL_CONFIG=accelerate_configs/multi_gpu_fp8.yaml; fi
fi
# HSDP profiles (a parallelism_config): replicate over the nodes, shard over the GPUs of each node
PARALLEL=""
if grep -qs '^parallelism_config:' "$ACCEL_CONFIG"; then
  PARALLEL="--parallelism_config_dp_replicate_size $NNODES --parallelism_config_dp_shard_size $GPUS_PER_NODE"
fi
# not `scontrol ... | head -n 1`: under pipefail, head closing the pipe early can fail the job with SIGPIPE (141)
mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
HEAD_NODE=${NODES[0]}
HEAD_NODE_IP=$(srun --nodes=1 --ntasks=1 -w "$HEAD_NODE" hostname --ip-address | awk '{print $1}')

# torchrun (inside accelerate launch) forwards these signals to the workers and waits this long
# before SIGKILL; keep it below the 120 s warning above.
export PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=100
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
# NCCL: let it find InfiniBand itself; set NCCL_SOCKET_IFNAME / NCCL_IB_HCA only if your site needs it.
# No CUDA_DEVICE_MAX_CONNECTIONS=1: it matters for tensor/sequence-parallel comm-GEMM overlap in
# TE/Megatron, not for DDP or ZeRO-1 (see docs/distributed.md).
mkdir -p logs

echo "job $SLURM_JOB_ID: $NNODES node(s) x $GPUS_PER_NODE GPU(s), head $HEAD_NODE ($HEAD_NODE_IP)," \
     "accelerate config $ACCEL_CONFIG, yxanul config $CONFIG, output $OUTPUT_DIR, restart ${SLURM_RESTART_COUNT:-0}"

PREEMPTED=0
# shellcheck disable=SC2317  # invoked by the trap, not unreachable
forward_signal() {
  PREEMPTED=1
  echo "$(date -Is) SIGUSR1: asking the training processes to checkpoint and exit"
  kill -USR1 "$SRUN_PID" 2>/dev/null || true
}
trap forward_signal USR1

# One task per node; $SLURM_NODEID is expanded inside each task (single quotes), so every node
# gets its own --machine_rank ($7, the HSDP sizes, is left unquoted: split into its flags on purpose).
# No --kill-on-bad-exit: after SIGUSR1 the agents exit non-zero one node at a time, and killing the
# slower nodes could cut their checkpoint writes short.
# shellcheck disable=SC2016  # expanded by the inner bash on each node, on purpose
srun --ntasks-per-node=1 --nodes="$NNODES" bash -c '
  exec accelerate launch --config_file "$0" \
    --num_machines "$1" --num_processes "$(( $1 * $2 ))" --machine_rank "$SLURM_NODEID" \
    --main_process_ip "$3" --main_process_port "$4" $7 \
    train.py --config "$5" --output_dir "$6" --resume auto "${@:8}"
' "$ACCEL_CONFIG" "$NNODES" "$GPUS_PER_NODE" "$HEAD_NODE_IP" "$MASTER_PORT" "$CONFIG" "$OUTPUT_DIR" "$PARALLEL" "$@" &
SRUN_PID=$!

# `wait` returns early when the trapped signal arrives: keep waiting until srun is gone.
RC=0
while true; do
  wait "$SRUN_PID" && RC=0 || RC=$?
  kill -0 "$SRUN_PID" 2>/dev/null || break
done

if (( PREEMPTED )); then
  echo "$(date -Is) training exited (rc=$RC) after SIGUSR1: requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
fi
exit "$RC"
