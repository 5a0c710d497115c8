"""End-to-end training on CPU through the real CLI: loss falls, exact resume, signals, listing."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from yxanul.tracking import read_metrics

# Small and fast on 2 cores; the bundled corpus and tokenizer (the real default data path).
FAST = ["--model", "tiny", "--seq_length", "32", "--micro_batch_size", "4", "--log_freq", "1",
        "--eval_freq", "0", "--eval_steps", "2", "--sample_tokens", "0", "--warmup_steps", "5",
        "--max_lr", "2e-3", "--use_tensorboard", "false", "--num_workers", "0"]


def yxanul(*args, check=True, **kw):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    r = subprocess.run([sys.executable, "-m", "yxanul", *args], capture_output=True, text=True, env=env, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"exit {r.returncode}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}")
    return r


def train_losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r}


def test_end_to_end_loss_falls_and_artifacts(tmp_path):
    out = tmp_path / "run"
    r = yxanul("train", *FAST, "--max_steps", "40", "--output_dir", str(out), "--checkpoint_freq", "20",
               "--use_tensorboard", "true", "--eval_freq", "20", "--sample_tokens", "8")
    losses = train_losses(out)
    assert sorted(losses) == list(range(1, 41))
    first, last = sum(losses[s] for s in (1, 2, 3)) / 3, sum(losses[s] for s in (38, 39, 40)) / 3
    assert last < first - 1.0, (first, last)           # a real drop, not noise
    line = next(line for line in r.stdout.splitlines() if line.startswith("step   40 |"))
    assert line.endswith("| FP32") and "| loss: " in line and "| tok/sec: " in line
    rows = read_metrics(out / "metrics.jsonl")
    assert {"step", "loss", "lr", "grad_norm", "dt_ms", "tokens_per_sec", "precision", "tokens_seen"} <= rows[0].keys()
    evals = [r for r in rows if "val_loss" in r]
    assert [e["step"] for e in evals] == [20, 40] and all("val_ppl" in e for e in evals)
    assert (out / "config.yaml").is_file() and (out / "precision_report.json").is_file()
    assert list((out / "tensorboard").rglob("events.out.tfevents.*"))
    hparams = yaml.safe_load(next((out / "tensorboard").rglob("hparams.yml")).read_text())  # the tracker config
    assert hparams["max_steps"] == 40 and hparams["precision_report/precision"] == "FP32"
    assert hparams["precision_report/layers/mlp/fp8"] == 0 and "precision_report/te_readback" in hparams
    state = json.loads((out / "checkpoints" / "step_40" / "trainer_state.json").read_text())
    assert state["step"] == 40 and state["precision"] == "FP32" and state["backend"] == "torch"
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_40"
    listing = yxanul("train", "--list_checkpoints", "--output_dir", str(out)).stdout
    assert "step_20" in listing and "step_40" in listing


def test_resume_is_exact(tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    common = [*FAST, "--lr_decay_steps", "60", "--checkpoint_freq", "0"]
    yxanul("train", *common, "--max_steps", "60", "--output_dir", str(full))
    yxanul("train", *common, "--max_steps", "30", "--output_dir", str(part))
    r = yxanul("train", *common, "--max_steps", "60", "--output_dir", str(part), "--resume", "latest")
    assert "resumed from" in r.stdout
    a, b = train_losses(full), train_losses(part)
    diffs = [abs(a[s] - b[s]) for s in range(31, 61)]
    assert max(diffs) <= 1e-5, max(diffs)


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="needs POSIX signals")
def test_sigusr1_saves_and_exits_zero(tmp_path):
    out = tmp_path / "sig"
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    p = subprocess.Popen([sys.executable, "-m", "yxanul", "train", *FAST, "--max_steps", "100000",
                          "--checkpoint_freq", "0", "--output_dir", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 120
    while time.time() < deadline and not (out / "metrics.jsonl").exists():
        time.sleep(0.5)
    time.sleep(2)
    p.send_signal(signal.SIGUSR1)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 0, stderr[-2000:]
    assert "checkpoint saved" in stdout
    state = json.loads((out / "checkpoints" / (out / "checkpoints" / "latest").read_text().strip()
                        / "trainer_state.json").read_text())
    assert 0 < state["step"] < 100000


@pytest.mark.skipif(__import__("importlib").util.find_spec("wandb") is None, reason="wandb not installed")
def test_wandb_offline_without_key(tmp_path):
    out = tmp_path / "wb"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HF_HUB_OFFLINE="1", HOME=str(tmp_path))  # no ~/.netrc, no API key
    r = subprocess.run([sys.executable, "-m", "yxanul", "train", *FAST, "--max_steps", "3", "--output_dir", str(out),
                        "--use_wandb", "--checkpoint_freq", "0", "--save_final", "false"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "W&B: no API key found, logging offline" in r.stdout
    assert list((out / "wandb").glob("offline-run-*"))
    log = next((out / "wandb").glob("offline-run-*/run-*.wandb")).read_bytes()  # W&B's record log, with the config
    assert b"precision_report/te_readback" in log and b"precision_report/layers/mlp/fp8" in log
