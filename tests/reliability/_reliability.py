"""Fault-injection suite helpers: the real CLI in subprocesses."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

PRESET = "nano"  # the 5M CPU preset
FAST = ["--model", PRESET, "--seq_length", "32", "--micro_batch_size", "4", "--log_freq", "1", "--eval_freq", "0",
        "--eval_steps", "2", "--sample_tokens", "0", "--warmup_steps", "2", "--max_lr", "2e-3",
        "--use_tensorboard", "false", "--num_workers", "0"]
EXIT_BOUND_S = 60  # "within seconds" on 2 shared cores: start-up included, far below any hang


def env():
    e = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1")
    e.pop("WANDB_API_KEY", None)
    return e


def yx(*args, timeout=300, **kw):
    return subprocess.run([sys.executable, "-m", "yxanul", *args], capture_output=True, text=True, env=env(),
                          timeout=timeout, **kw)


def ok(r):
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


def one_line(r, code: int, needle: str):
    """Exit ``code``, stderr exactly one line containing ``needle``, no traceback."""
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == code, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr and len(lines) == 1 and needle in lines[0], r.stderr[-3000:]


def losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def popen(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "yxanul", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env(), **kw)


def wait_for(path: Path, timeout=180.0) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.2)


def kill_group(p) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
