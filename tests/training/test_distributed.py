"""Two CPU processes (gloo) through `accelerate launch` with the shipped cpu profile.

Tolerance: the 2-process run averages gradients across ranks with an all-reduce, the 1-process run
averages them through gradient accumulation; the windows per optimizer step are identical (the
loader hands out global positions), so only the float summation order differs. Over 16 steps of
the tiny model that stays below 2e-4 absolute in the loss; we assert 1e-3.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_run import FAST

from yxanul.tracking import read_metrics

ROOT = Path(__file__).resolve().parents[2]
# the tiny run at the default micro-batch (8), warmup 4 of a 16-step decay
RUN = [*FAST, "--micro_batch_size", "8", "--warmup_steps", "4", "--lr_decay_steps", "16"]
TOL = 1e-3

pytestmark = pytest.mark.skipif(shutil.which("accelerate") is None, reason="accelerate CLI not on PATH")


def _env():
    return dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1")


def _launch_cmd(*args):
    return ["accelerate", "launch", "--config_file", str(ROOT / "accelerate_configs" / "cpu.yaml"),
            str(ROOT / "train.py"), *RUN, *args]


def launch2(*args, cwd=ROOT, env=None):
    r = subprocess.run(_launch_cmd(*args), capture_output=True, text=True, env=env or _env(), cwd=cwd, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def single(*args):
    cmd = [sys.executable, "-m", "yxanul", "train", *RUN, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def losses(run_dir):
    return {r["step"]: r["loss"] for r in read_metrics(Path(run_dir) / "metrics.jsonl") if "loss" in r}


SKEW = """import os, time
if os.environ.get("RANK") == "1":  # rank 1's clock runs 5 s ahead of rank 0's
    _strftime = time.strftime
    time.strftime = lambda fmt, t=None: _strftime(
        fmt, time.localtime((time.time() if t is None else time.mktime(t)) + 5))
"""


def test_two_processes_match_one_process_with_double_accumulation_and_resume(tmp_path):
    one, mixed = tmp_path / "one", tmp_path / "mixed"
    # no --output_dir/--run_name, clocks 5 s apart: both ranks still write ONE default run dir (rank 0's name)
    (tmp_path / "skew").mkdir()
    (tmp_path / "skew" / "sitecustomize.py").write_text(SKEW)
    r = launch2("--micro_batch_size", "2", "--gradient_accumulation_steps", "1", "--max_steps", "16",
                "--checkpoint_freq", "8", "--keep_last", "5", cwd=tmp_path,
                env=dict(_env(), PYTHONPATH=os.pathsep.join([str(tmp_path / "skew"), str(ROOT)])))
    assert "x world 2" in r.stdout  # effective batch printed with the world size
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("nano-"), runs
    two = runs[0]
    single("--micro_batch_size", "2", "--gradient_accumulation_steps", "2", "--max_steps", "16",
           "--checkpoint_freq", "0", "--output_dir", str(one))
    a, b = losses(two), losses(one)
    assert sorted(a) == sorted(b) == list(range(1, 17))
    assert max(abs(a[s] - b[s]) for s in a) < TOL
    vals = [[r["val_loss"] for r in read_metrics(run / "metrics.jsonl") if "val_loss" in r] for run in (two, one)]
    assert vals[0] and len(vals[0]) == len(vals[1])  # the validation averages over both ranks' batches
    assert max(abs(a - b) for a, b in zip(*vals)) < TOL, vals
    for run in (two, one):  # tokens/s (and the MFU from it) count the tokens of all processes: 2 x 32 x 2 a step
        rows = [r for r in read_metrics(run / "metrics.jsonl") if "tokens_per_sec" in r]
        assert len(rows) == 16 and all(r["tokens_per_sec"] == pytest.approx(128e3 / r["dt_ms"], rel=1e-6)
                                       for r in rows), rows[:2]
    # a checkpoint written by 2 processes resumes in 1 process (accumulation doubled)
    shutil.copytree(two / "checkpoints" / "step_8", mixed / "checkpoints" / "step_8")
    (mixed / "checkpoints" / "latest").write_text("step_8\n")
    r = single("--micro_batch_size", "2", "--gradient_accumulation_steps", "2", "--max_steps", "16",
               "--checkpoint_freq", "0", "--output_dir", str(mixed), "--resume", "latest")
    assert "world_size: 2 -> 1" in r.stdout
    c = losses(mixed)
    assert sorted(c) == list(range(9, 17))
    assert max(abs(a[s] - c[s]) for s in c) < TOL


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="needs POSIX signals")
def test_a_signal_to_one_rank_stops_both_on_the_same_step(tmp_path):
    """SIGUSR1 to rank 1 only: rank 0 learns of it through the per-step agreement, both ranks save
    one checkpoint at the same step and exit 0, so the launcher exits 0 too. `log_freq` is huge: the
    ranks agree on every step, not only on logging steps (which log_freq=1 would hide)."""
    import psutil

    out = tmp_path / "sig"
    proc = subprocess.Popen(_launch_cmd("--micro_batch_size", "2", "--max_steps", "100000", "--checkpoint_freq", "0",
                                        "--log_freq", "100000", "--output_dir", str(out)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if (out / "metrics.jsonl").exists():  # step 1 is logged: both ranks are in the loop
                break
            time.sleep(0.2)
        time.sleep(1)

        def rank(p):
            try:
                return p.environ().get("RANK")
            except psutil.Error:
                return None

        workers = {rank(c): c for c in psutil.Process(proc.pid).children(recursive=True)}
        assert {"0", "1"} <= set(workers), workers
        workers["1"].send_signal(signal.SIGUSR1)
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    m = re.search(r"received a stop signal on another rank: checkpoint saved at step (\d+), exiting", stdout)
    assert m, stdout[-3000:]
    step = int(m.group(1))
    latest = (out / "checkpoints" / "latest").read_text().strip()
    state = json.loads((out / "checkpoints" / latest / "trainer_state.json").read_text())
    assert (state["step"], state["world_size"]) == (step, 2) and step > 1
