"""The tiny training run every training test starts from, the real CLI in a subprocess, and the same run
under DeepSpeed. Defined once here (tests/conftest.py serves the first two as the ``fast`` and ``yx``
fixtures); a module that needs them at import time (a launcher helper, a parametrize table) imports them:
``from tiny_run import FAST, yx``."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# nano preset on 32-token windows of the bundled corpus, no validation during training, no samples, no
# TensorBoard, no loader workers. A test appends what it needs: a later flag wins.
FAST = ("--model", "nano", "--seq_length", "32", "--micro_batch_size", "4", "--log_freq", "1", "--eval_freq", "0",
        "--eval_steps", "2", "--sample_tokens", "0", "--warmup_steps", "1", "--max_lr", "2e-3",
        "--use_tensorboard", "false", "--num_workers", "0")


def yx(*args, check: bool = True, **kw) -> subprocess.CompletedProcess:
    """`python -m yxanul ARGS` in a subprocess, offline; a non-zero exit raises with the tails of stdout
    and stderr unless ``check=False``."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    r = subprocess.run([sys.executable, "-m", "yxanul", *map(str, args)], capture_output=True, text=True, env=env,
                       **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"exit {r.returncode}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}")
    return r


# under DeepSpeed: an 8-step decay and clipping at 0.5, not accelerate's 1.0 for gradient_clipping "auto"
# (DeepSpeed must get ours)
DS_RUN = (*FAST, "--lr_decay_steps", "8", "--max_grad_norm", "0.5")


def deepspeed_env() -> dict:
    """The environment of a DeepSpeed run: its JIT-built ops cached in YXANUL_CACHE/torch_extensions."""
    cache = Path(os.environ.get("YXANUL_CACHE", Path.home() / ".cache" / "yxanul"))
    return dict(os.environ, HF_HUB_OFFLINE="1", TORCH_EXTENSIONS_DIR=str(cache / "torch_extensions"))


def ds_train(*args, stage=1, procs=1, ok=True) -> subprocess.CompletedProcess:
    """`accelerate launch --use_deepspeed train.py` with ds_configs/zero{stage}.json on ``procs`` processes,
    DS_RUN + ``args``; asserts the exit code is 0 exactly when ``ok``."""
    cmd = ["accelerate", "launch", "--use_deepspeed", "--deepspeed_config_file",
           str(ROOT / "ds_configs" / f"zero{stage}.json"), "--num_processes", str(procs), "--num_machines", "1",
           "--main_process_port", "0", str(ROOT / "train.py"), *DS_RUN, *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=deepspeed_env(), cwd=ROOT, timeout=900)
    assert (r.returncode == 0) == ok, r.stdout[-3000:] + r.stderr[-3000:]
    return r
