"""`yxanul sweep` offline on the real tinyshakespeare sweep file: 3 real trials (a few steps each) as
subprocesses, killed mid-trial (the whole process group, like a lost node), then the same command
again: finished trials are skipped, the interrupted one resumes from its checkpoint, and the table,
best.json and PNGs are written."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "sweeps" / "penalty_weight_tinyshakespeare.yaml"
PRESET = "nano"  # the 5M CPU preset
TRIAL_FLAGS = ["--model", PRESET, "--seq_length", "32", "--micro_batch_size", "4", "--eval_steps", "2",
               "--sample_tokens", "0", "--warmup_steps", "2", "--use_tensorboard", "false", "--num_workers", "0",
               "--max_steps", "6", "--warmup_steps", "2", "--eval_freq", "3", "--checkpoint_freq", "2", "--log_freq",
               "1"]
PNG = b"\x89PNG\r\n\x1a\n"


def start(out: Path, env):
    cmd = [sys.executable, "-m", "yxanul", "sweep", str(SWEEP), "--offline", "--count", "3",
           "--output_root", str(out), *TRIAL_FLAGS]
    return subprocess.Popen(cmd, cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def final_val(run_dir: Path) -> float:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "val_loss" in r][-1]["val_loss"]


@pytest.mark.slow
def test_offline_sweep_killed_mid_trial_resumes_and_reports(tmp_path):
    env = dict(os.environ, YXANUL_CACHE=str(tmp_path / "cache"), WANDB_MODE="offline", OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    sweep = tmp_path / "sweeps" / "penalty_weight_tinyshakespeare"
    proc = start(tmp_path, env)
    t1 = sweep / "trial-001"
    t0 = time.time()
    while not (t1 / "checkpoints" / "step_2").is_dir():  # trial-001 is past its first checkpoint
        assert proc.poll() is None and time.time() - t0 < 400, proc.stdout.read()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its trial, at once
    proc.wait()
    assert not (t1 / "summary.json").exists()  # really interrupted mid-trial
    done0 = (sweep / "trial-000" / "metrics.jsonl").read_bytes()
    assert json.loads((sweep / "trial-000" / "summary.json").read_text())["steps"] == 6

    proc = start(tmp_path, env)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    assert "trial-000 {" in out and "already finished, skipped" in out
    assert (sweep / "trial-000" / "metrics.jsonl").read_bytes() == done0  # not run again
    assert "[trial-001] resumed from" in out and "at step " in out
    assert "[trial-000]" not in out
    assert "wandb: Run summary" not in out  # W&B's per-trial footer (quiet), the sync command said once instead
    assert f"upload them with: wandb sync {sweep}/*/wandb/offline-run-*" in out
    for i in range(3):
        run = sweep / f"trial-00{i}"
        assert json.loads((run / "summary.json").read_text())["steps"] == 6
        assert list((run / "wandb").glob("offline-run-*")), "W&B offline files kept for `wandb sync`"
    state = json.loads((sweep / "sweep.json").read_text())
    assert [t["params"]["penalty_weight"] for t in state["trials"]] == [0.0, 0.001, 0.01]
    assert {t["status"] for t in state["trials"]} == {"done"}

    best = json.loads((sweep / "best.json").read_text())
    vals = {f"trial-00{i}": final_val(sweep / f"trial-00{i}") for i in range(3)}
    assert best["trial"] == min(vals, key=vals.get) and best["final"] == pytest.approx(vals[best["trial"]])
    assert best["params"]["max_steps"] == 6  # what ran (the override), not the file's 150
    table = (sweep / "summary.md").read_text()
    assert "| trial | penalty_weight | final val_loss | best val_loss | tokens/s | precision |" in table
    assert table.count("| trial-00") == 3 and "FP32" in table
    for png in ("eval_val_loss_vs_penalty_weight.png", "loss_curves.png"):
        assert (sweep / png).read_bytes()[:8] == PNG

    # --summary alone redoes the report from the run directories
    (sweep / "best.json").unlink()
    r = subprocess.run([sys.executable, "-m", "yxanul", "sweep", str(SWEEP), "--summary", "--output_root",
                        str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "| trial-002 |" in r.stdout and (sweep / "best.json").is_file(), r.stderr


ACCEL_SWEEP = """name: accel_check
method: grid
metric: {name: eval/val_loss, goal: minimize}
command:
  - ${env}
  - accelerate
  - launch
  - --config_file
  - %s
  - train.py
  - ${args}
parameters:
  penalty_weight: {values: [0.02]}
  penalty_type: {value: z_loss}
"""


@pytest.mark.slow
def test_accelerate_launch_trial_runs_every_rank_with_the_trials_flags(tmp_path):
    """A sweep file whose command is `accelerate launch ... train.py ${args}`: the trial runs on 2 CPU
    ranks (accelerate_configs/cpu.yaml), each parsing the trial's flags."""
    f = tmp_path / "accel.yaml"
    f.write_text(ACCEL_SWEEP % (ROOT / "accelerate_configs" / "cpu.yaml"))
    env = dict(os.environ, YXANUL_CACHE=str(tmp_path / "cache"), ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    flags = [*TRIAL_FLAGS, "--max_steps", "2", "--warmup_steps", "1", "--eval_freq", "0", "--checkpoint_freq", "0",
             "--use_wandb", "false"]
    r = subprocess.run([sys.executable, "-m", "yxanul", "sweep", str(f), "--offline", "--output_root", str(tmp_path),
                        *flags],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "x world 2 = " in r.stdout  # two ranks
    run = tmp_path / "sweeps" / "accel_check" / "trial-000"
    cfg = (run / "config.yaml").read_text()
    assert "penalty_weight: 0.02" in cfg and "penalty_type: z_loss" in cfg
    assert json.loads((run / "summary.json").read_text())["steps"] == 2


def test_a_sweep_whose_trials_fail_exits_1_and_names_them(tmp_path):
    """Each trial is its own `yxanul train`: one that fails (here its data file is missing: exit 2 in the trial)
    does not stop the others, and the sweep ends with exit 1 naming every failed trial and its log."""
    env = dict(os.environ, YXANUL_CACHE=str(tmp_path / "cache"), WANDB_MODE="offline", OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    r = subprocess.run([sys.executable, "-m", "yxanul", "sweep", str(SWEEP), "--offline", "--count", "2",
                        "--output_root", str(tmp_path), *TRIAL_FLAGS, "--dataset", str(tmp_path / "none.jsonl")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert "wandb sync" not in r.stdout  # no trial got as far as a W&B run
    assert "2 trial(s) failed: trial-000, trial-001 (run the same command to retry)" in r.stdout
    log = tmp_path / "sweeps" / "penalty_weight_tinyshakespeare" / "trial-000" / "train.log"
    assert f"trial-000 failed (exit code 2, log {log})" in r.stdout and "none.jsonl" in log.read_text()


def where_logged(run_dir: Path) -> tuple[str, str]:
    """(project, entity) of the run record in a trial's W&B offline file, as `wandb sync` reads it: a ':W&B' header
    of 7 bytes, then records of a 7-byte header (crc, length, type) and a protobuf Record (the run's comes early)."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    (f,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data, pos = f.read_bytes(), 7
    while pos < len(data):
        _, n, _ = struct.unpack("<IHB", data[pos:pos + 7])
        rec = pb.Record()
        rec.ParseFromString(data[pos + 7:pos + 7 + n])
        if rec.WhichOneof("record_type") == "run":
            return rec.run.project, rec.run.entity
        pos += 7 + n
    raise AssertionError(f"no run record in {f}")


PROJECT_SWEEP = """name: proj_check
project: file-project
entity: file-team
method: grid
metric: {name: train/ppl, goal: minimize}
parameters:
  penalty_weight: {values: [0.0]}
"""


def test_offline_trials_log_to_the_files_project_and_a_rerun_under_another_continues(tmp_path):
    """The sweep file's project/entity are the trials' W&B settings (W&B's default project took every offline
    sweep's runs before), a --wandb_project flag wins, and a rerun under another project is no other sweep."""
    from yxanul.config import parse_args
    from yxanul.sweep.local import plan
    from yxanul.sweep.spec import load_spec

    (tmp_path / "s.yaml").write_text(PROJECT_SWEEP)
    spec = load_spec(str(tmp_path / "s.yaml"))
    t = plan(spec, str(tmp_path), ["--max_steps", "7"], None, 0, say=lambda *_: None)[1][0]
    assert (t.settings["wandb_project"], t.settings["wandb_entity"]) == ("file-project", "file-team")
    t.run_dir.mkdir(parents=True)  # the trial ran: the config.yaml the trainer writes at its start
    parse_args(["--config", str(ROOT / "yxanul" / "assets" / "default.yaml"), *t.argv]).save(t.run_dir / "config.yaml")
    again = plan(spec, str(tmp_path), ["--max_steps", "7", "--wandb_project", "other"], None, 0,
                 say=lambda *_: None)[1][0]
    assert again.settings["wandb_project"] == "other" and again.changed_settings() == []


@pytest.mark.slow
def test_offline_sweep_runs_are_synced_to_the_files_project(tmp_path):
    """The real sweep: the trial's W&B offline run records the file's project and entity (what `wandb sync`
    uploads to); its metric train/ppl ranks it (exp of the logged LM loss); the same sweep rerun under another
    project skips the finished trial instead of refusing it."""
    env = dict(os.environ, YXANUL_CACHE=str(tmp_path / "cache"), WANDB_MODE="offline", OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    (tmp_path / "s.yaml").write_text(PROJECT_SWEEP)
    cmd = [sys.executable, "-m", "yxanul", "sweep", str(tmp_path / "s.yaml"), "--offline", "--output_root",
           str(tmp_path), *TRIAL_FLAGS, "--max_steps", "2", "--warmup_steps", "1", "--eval_freq", "0",
           "--checkpoint_freq", "0"]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = tmp_path / "sweeps" / "proj_check" / "trial-000"
    assert where_logged(run) == ("file-project", "file-team")
    last = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"tokens_per_sec"' in x][-1]
    best = json.loads((tmp_path / "sweeps" / "proj_check" / "best.json").read_text())
    assert best["trial"] == "trial-000" and best["final"] == pytest.approx(math.exp(last["loss"]))
    r = subprocess.run([*cmd, "--wandb_project", "moved"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=400)
    assert r.returncode == 0 and "trial-000 {'penalty_weight': 0.0} already finished, skipped" in r.stdout, \
        r.stdout[-3000:] + r.stderr[-3000:]
