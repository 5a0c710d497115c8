"""Two "nodes" on one machine, started the way users start them: one `accelerate launch` per node with
`--num_machines 2 --machine_rank 0|1 --main_process_ip 127.0.0.1`, and examples/slurm/submit_fp8.sh
through a stand-in `srun` that runs its per-node command once per node, locally. CPU, gloo, one
process per node (the shipped accelerate_configs/cpu.yaml, as on a real cluster with a GPU profile).

Losses: the same world size on one node or two runs the same all-reduce over the same 2 ranks in the
same order, so the losses agree to float32 rounding of identical operations (asserted 1e-6).
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from tiny_run import FAST

from yxanul.tracking import read_metrics

ROOT = Path(__file__).resolve().parents[2]
CPU_YAML = str(ROOT / "accelerate_configs" / "cpu.yaml")
# the tiny run at micro-batch 2 with an 8-step decay
RUN = [*FAST, "--lr_decay_steps", "8", "--micro_batch_size", "2"]

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="needs POSIX signals")


def _env(**extra):
    # the SLURM script's signal settings: torchrun forwards SIGTERM/SIGUSR1 and waits for the checkpoint
    return dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", ACCELERATE_USE_CPU="1",
                OMP_NUM_THREADS="1", PET_SIGNALS_TO_HANDLE="SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
                TORCH_ELASTIC_SHUTDOWN_TIMEOUT="100", **extra)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node(rank: int, port: int, *args) -> subprocess.Popen:
    """One node's launcher, in its own process group (a node's processes, as SLURM/k8s signal them)."""
    cmd = ["accelerate", "launch", "--config_file", CPU_YAML, "--num_machines", "2", "--num_processes", "2",
           "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1", "--main_process_port", str(port),
           str(ROOT / "train.py"), *RUN, *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), cwd=ROOT,
                            start_new_session=True)


def one_node(*args) -> str:
    cmd = ["accelerate", "launch", "--config_file", CPU_YAML, str(ROOT / "train.py"), *RUN, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def finish(*procs, timeout=600) -> list[str]:
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    return outs


def losses(run_dir):
    return {r["step"]: r["loss"] for r in read_metrics(Path(run_dir) / "metrics.jsonl") if "loss" in r}


def wait_for_step(run_dir: Path, procs, limit=300):
    deadline = time.time() + limit
    while time.time() < deadline and all(p.poll() is None for p in procs):
        if (run_dir / "metrics.jsonl").exists() and (run_dir / "metrics.jsonl").read_text().strip():
            return
        time.sleep(0.2)
    raise AssertionError("no step logged: " + "".join(p.stdout.read() for p in procs if p.poll() is not None))


def test_two_nodes_one_run_dir_then_resume_on_one_node(tmp_path):
    """2 nodes x 1 process: one run dir written by global rank 0 only (node 1's rank 0 is LOCAL rank 0
    but not the main process), each rank's RNG state in the shared checkpoint; then one node with
    2 processes resumes the 2-node checkpoint (another node count, same world size) with the same losses."""
    run = tmp_path / "two"
    port = _port()
    out0, out1 = finish(node(0, port, "--max_steps", "6", "--checkpoint_freq", "3", "--output_dir", str(run)),
                        node(1, port, "--max_steps", "6", "--checkpoint_freq", "3", "--output_dir", str(run)))
    assert "x world 2" in out0 and "step    6" in out0, out0[-3000:]
    assert "step    1" not in out1 and "training 6 steps" not in out1, out1[-3000:]  # rank 1 prints nothing
    a = losses(run)
    assert sorted(a) == list(range(1, 7))
    assert sorted(p.name for p in run.iterdir()) == [".yxanul.lock", "checkpoints", "config.yaml",  # one writer
                                                     "metrics.jsonl", "precision_report.json", "summary.json"]
    ckpt = run / "checkpoints" / "step_3"
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= set(json.loads((ckpt / "manifest.json").read_text())
                                                               ["files"])
    res = tmp_path / "one"
    (res / "checkpoints").mkdir(parents=True)
    shutil.copytree(ckpt, res / "checkpoints" / "step_3")
    one_node("--max_steps", "6", "--checkpoint_freq", "0", "--output_dir", str(res), "--resume", "latest")
    b = losses(res)
    assert sorted(b) == [4, 5, 6] and max(abs(a[s] - b[s]) for s in b) < 1e-6


@pytest.mark.slow
def test_sigterm_to_one_node_checkpoints_and_stops_both(tmp_path):
    """SIGTERM to node 1's process group (its launcher and its worker, as a preempted node gets it):
    node 0 learns of it through the per-step agreement, both ranks save ONE checkpoint at the same
    step, node 0's worker exits 0; then 2 nodes resume it and train on."""
    import psutil

    run = tmp_path / "sig"
    port = _port()
    flags = ["--max_steps", "100000", "--lr_decay_steps", "100000", "--checkpoint_freq", "0", "--log_freq",
             "100000", "--output_dir", str(run)]
    n0, n1 = node(0, port, *flags), node(1, port, *flags)
    try:
        wait_for_step(run, (n0, n1))
        time.sleep(1)
        os.killpg(n1.pid, signal.SIGTERM)
        n1.communicate(timeout=180)
        # node 0's worker saves and exits 0; its launcher then waits in torchrun's exit barrier (300 s,
        # fixed in torch's agent) for node 1's launcher, which the signal ended: stop waiting for it here
        deadline = time.time() + 180
        while time.time() < deadline and psutil.Process(n0.pid).children(recursive=True):
            time.sleep(0.5)
        assert not psutil.Process(n0.pid).children(recursive=True), "node 0's worker did not exit"
        os.killpg(n0.pid, signal.SIGKILL)
        out0 = n0.communicate(timeout=30)[0]
    finally:
        for p in (n0, n1):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert "exitcode  : " not in out0, out0[-3000:]  # torchrun reports a failed worker this way
    m = re.search(r"received a stop signal on another rank: checkpoint saved at step (\d+), exiting", out0)
    assert m, out0[-3000:]
    step = int(m.group(1))
    assert [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step_")] == [f"step_{step}"]
    state = json.loads((run / "checkpoints" / f"step_{step}" / "trainer_state.json").read_text())
    assert (state["step"], state["world_size"]) == (step, 2)
    port = _port()
    resume = ["--max_steps", str(step + 2), "--lr_decay_steps", "100000", "--checkpoint_freq", "0",
              "--output_dir", str(run), "--resume", "latest"]
    out0, _ = finish(node(0, port, *resume), node(1, port, *resume))
    resumed = f"resumed from {run / 'checkpoints' / f'step_{step}'}"
    assert resumed in out0 and f"step {step + 2:4d}" in out0, out0[-3000:]


SRUN = """#!/usr/bin/env bash
# stand-in srun: `srun ... hostname ...` prints the head node's address; `srun --nodes=N ... bash -c CMD ARGS`
# runs CMD once per node here, with that node's SLURM_NODEID, and forwards USR1/TERM to every node
echo "srun $*" >> "$CALLS"
if [[ " $* " == *" hostname "* ]]; then echo 127.0.0.1; exit 0; fi
n=1
for a in "$@"; do [[ $a == --nodes=* ]] && n=${a#--nodes=}; done
while [ "$1" != bash ]; do shift; done
pids=()
for ((i = 0; i < n; i++)); do SLURM_NODEID=$i "$@" > "$LOGS/node$i.log" 2>&1 & pids+=($!); done
trap 'kill -USR1 "${pids[@]}" 2>/dev/null' USR1
trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM
rc=0
for p in "${pids[@]}"; do
  while true; do wait "$p" && break; s=$?; kill -0 "$p" 2>/dev/null || { rc=$s; break; }; done
done
exit $rc
"""


@pytest.mark.slow
def test_slurm_script_runs_two_nodes_through_a_stand_in_srun(tmp_path):
    """examples/slurm/submit_fp8.sh with SLURM_NNODES=2 and the CPU profile: its `srun` line starts both
    nodes (machine ranks from SLURM_NODEID), SIGUSR1 to the batch shell checkpoints both and requeues;
    the requeued job (same id, now ONE node with 2 processes) resumes from that checkpoint."""
    bindir, logs = tmp_path / "bin", tmp_path / "logs"
    bindir.mkdir()
    logs.mkdir()
    (bindir / "srun").write_text(SRUN)
    (bindir / "scontrol").write_text('#!/usr/bin/env bash\necho "scontrol $*" >> "$CALLS"\n'
                                     '[ "$1 $2" = "show hostnames" ] && printf "node1\\nnode2\\n"\nexit 0\n')
    for f in bindir.iterdir():
        f.chmod(0o755)
    os.symlink(ROOT / "train.py", tmp_path / "train.py")
    os.symlink(ROOT / "accelerate_configs", tmp_path / "accelerate_configs")
    (tmp_path / "c.yaml").write_text("model: nano\nseq_length: 32\nmicro_batch_size: 2\n")
    calls, run = tmp_path / "calls.log", tmp_path / "runs" / "t-77"
    env = _env(PATH=f"{bindir}:{os.environ['PATH']}", CALLS=str(calls), LOGS=str(logs), SLURM_JOB_ID="77",
               SLURM_JOB_NAME="t", SLURM_JOB_NODELIST="node[1-2]", SLURM_NNODES="2", GPUS_PER_NODE="1",
               ACCEL_CONFIG="accelerate_configs/cpu.yaml", MASTER_PORT=str(_port()))
    rest = [*RUN[4:], "--max_steps", "100000", "--lr_decay_steps", "100000", "--checkpoint_freq", "0",
            "--log_freq", "100000"]
    job = subprocess.Popen(["bash", str(ROOT / "examples" / "slurm" / "submit_fp8.sh"), "c.yaml", *rest],
                           cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and job.poll() is None and not (run / "metrics.jsonl").exists():
            time.sleep(0.2)
        time.sleep(1)
        job.send_signal(signal.SIGUSR1)
        out = job.communicate(timeout=180)[0]
    finally:
        job.kill()
    node0 = (logs / "node0.log").read_text()
    assert job.returncode == 0 and "scontrol requeue 77" in calls.read_text(), out + node0[-3000:]
    m = re.search(r"received (SIGUSR1|a stop signal on another rank): checkpoint saved at step (\d+), exiting", node0)
    assert m and "x world 2" in node0, node0[-3000:]
    step = int(m.group(2))
    # the requeued job on one node (2 processes): same run dir, --resume latest from the script
    env.update(SLURM_NNODES="1", SLURM_JOB_NODELIST="node1", GPUS_PER_NODE="2", MASTER_PORT=str(_port()))
    rest[rest.index("--max_steps") + 1] = str(step + 2)
    r = subprocess.run(["bash", str(ROOT / "examples" / "slurm" / "submit_fp8.sh"), "c.yaml", *rest],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    node0 = (logs / "node0.log").read_text()
    assert r.returncode == 0, r.stdout + node0[-3000:]
    assert f"resumed from runs/t-77/checkpoints/step_{step}" in node0 and f"step {step + 2:4d}" in node0, node0
