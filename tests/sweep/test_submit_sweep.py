"""examples/slurm/submit_sweep.sh, checked like submit_fp8.sh (tests/test_cluster_files.py runs `bash -n`
and shellcheck on every script): with fake srun/scontrol/yxanul, SIGUSR1 to the batch shell reaches
the agent, which 'checkpoints' and exits, and the array task is requeued."""

import os
import shutil
import signal
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "slurm", "submit_sweep.sh")


def _shim(bindir, name, body):
    path = bindir / name
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)


@pytest.fixture
def fake_slurm(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "calls.log"
    _shim(bindir, "scontrol", f'echo "scontrol $*" >> {log}\nexit 0\n')
    _shim(bindir, "srun", f'echo "srun $*" >> {log}\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
    _shim(bindir, "yxanul", f'echo "yxanul $* agent=$YXANUL_SWEEP_AGENT pet=$PET_SIGNALS_TO_HANDLE" >> {log}\n'
          f'trap \'echo saved >> {log}; exit 0\' USR1\n'
          f'touch {tmp_path}/ready\nfor _ in $(seq 300); do sleep 0.1; done\nexit 3\n')
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", SLURM_JOB_ID="4243", SLURM_ARRAY_JOB_ID="77",
               SLURM_ARRAY_TASK_ID="3", SLURM_JOB_NAME="t")
    return tmp_path, log, env


def test_shellcheck_clean():
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck not installed (apt-get install -y shellcheck)")
    r = subprocess.run(["shellcheck", "--severity=info", SCRIPT], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_sigusr1_reaches_the_agent_and_the_array_task_is_requeued(fake_slurm):
    tmp_path, log, env = fake_slurm
    proc = subprocess.Popen(["bash", SCRIPT, "sweeps/penalty_weight_fineweb_edu.yaml", "--max_steps", "50"],
                            cwd=tmp_path, env=dict(env, SWEEP_ID="ent/proj/abc123"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    for _ in range(100):
        if (tmp_path / "ready").exists():
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=30)
    calls = log.read_text()
    assert proc.returncode == 0, out + calls
    assert "saved" in calls and "scontrol requeue 77_3" in calls, calls
    agent = next(line for line in calls.splitlines() if line.startswith("yxanul "))
    for part in ("sweep sweeps/penalty_weight_fineweb_edu.yaml", "--sweep_id ent/proj/abc123", "--count 1",
                 "--output_root runs", "--max_steps 50", "agent=77_3", "pet=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"):
        assert part in agent, agent


def test_without_sweep_id_it_stops_with_one_line(fake_slurm):
    tmp_path, log, env = fake_slurm
    env.pop("SWEEP_ID", None)
    r = subprocess.run(["bash", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "SWEEP_ID" in r.stderr and "--export=ALL,SWEEP_ID=" in r.stderr
    assert not log.exists() or "yxanul" not in log.read_text()


def test_agent_exit_code_is_the_jobs_when_not_preempted(fake_slurm):
    tmp_path, log, env = fake_slurm
    bindir = tmp_path / "bin"
    _shim(bindir, "yxanul", 'exit 1\n')
    r = subprocess.run(["bash", SCRIPT], cwd=tmp_path, env=dict(env, SWEEP_ID="s"), capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 1 and "requeue" not in log.read_text()


K8S_AGENTS = os.path.join(ROOT, "examples", "k8s", "sweep", "agents.yaml")


def test_k8s_sweep_agents_job():
    """The Kubernetes variant: a Job of N single-GPU agent pods on the shared run-directory PVC."""
    import yaml

    (job,) = [d for d in yaml.safe_load_all(open(K8S_AGENTS)) if d]
    (pvc,) = [d for d in yaml.safe_load_all(open(os.path.join(ROOT, "examples", "k8s", "pvc.yaml"))) if d]
    try:
        import kubernetes_validate as kv

        kv.validate(job, kv.latest_version(), strict=True)
    except ImportError:
        pass
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e for e in c["env"]}
    cmd = " ".join(c["args"])
    assert cmd.startswith("exec yxanul sweep") and '--sweep_id "$SWEEP_ID"' in cmd and "--count 1" in cmd
    assert os.path.isfile(os.path.join(ROOT, env["SWEEP_FILE"]["value"]))
    assert env["WANDB_API_KEY"]["valueFrom"]["secretKeyRef"]["key"]
    assert "SIGTERM" in env["PET_SIGNALS_TO_HANDLE"]["value"]
    assert int(env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]["value"]) < pod["terminationGracePeriodSeconds"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    runs = next(v for v in pod["volumes"] if v["name"] == "runs")
    assert runs["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    mount = next(m["mountPath"] for m in c["volumeMounts"] if m["name"] == "runs")
    assert cmd.split("--output_root ")[1].split()[0].startswith(mount)
