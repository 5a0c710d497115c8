"""The default run's loss baseline (tests/assets/loss_baseline.json), as torchtitan keeps its own.

    python scripts/loss_baseline.py            # compare this machine's first steps with the baseline
    python scripts/loss_baseline.py --write    # re-record it: first steps + the whole default `yxanul train`
                                               # (README's numbers) + the dependency set it ran with

The first steps run the default config (`yxanul train` with no flags) through the real Trainer's
`advance` (`training.step.train_step` at the scheduled LR), in-process, then one validation loss at that
step. tests/test_loss_baseline.py calls `first_steps()` and compares with the committed file; README
quotes `default_run`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

BASELINE = Path(__file__).resolve().parents[1] / "tests" / "assets" / "loss_baseline.json"
PACKAGES = ("torch", "transformers", "accelerate", "tokenizers", "datasets", "safetensors", "numpy")
STEPS = 20
QUIET = ["--use_tensorboard", "false", "--sample_tokens", "0"]  # neither changes a loss


def dependency_set() -> dict[str, str]:
    return {"python": platform.python_version(), **{p: importlib.metadata.version(p) for p in PACKAGES}}


def machine() -> dict[str, object]:
    """The CPU the numbers came from: beyond the first steps, its kernels' rounding moves the later digits."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").is_file() else ""
    return {"cpu": model or platform.machine(), "cores": os.cpu_count()}


def first_steps(n: int, output_dir: str) -> dict:
    """Losses of the default run's first ``n`` optimizer steps and the validation loss after them."""
    from yxanul.config import DEFAULT_CONFIG, parse_args
    from yxanul.training.evaluation import evaluate_loss
    from yxanul.training.trainer import Trainer

    cfg = parse_args(["--config", DEFAULT_CONFIG, "--output_dir", output_dir, *QUIET])
    t = Trainer(cfg, callbacks=[]).setup()
    t.model.train()
    losses = [t._mean(t.advance(t.next_batches()).loss) for _ in range(n)]  # the logged loss of each step
    val_loss = evaluate_loss(t.model, t.val, t.plan, t.accelerator)
    with contextlib.redirect_stdout(io.StringIO()):  # its summary speaks of a `fit` (checkpoints, resume): none ran
        t.finish()
    return {"steps": n, "losses": losses, "val_loss": val_loss}


def default_run(output_dir: str) -> dict:
    """README's numbers: the whole default `yxanul train`, from its metrics.jsonl."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    subprocess.run([sys.executable, "-m", "yxanul", "train", "--output_dir", output_dir, *QUIET], check=True, env=env)
    rows = [json.loads(line) for line in Path(output_dir, "metrics.jsonl").read_text().splitlines()]
    loss = {str(r["step"]): round(r["loss"], 6) for r in rows if "loss" in r and r["step"] in (1, 150, 300)}
    ppl = {str(r["step"]): round(math.exp(r["val_loss"]), 2) for r in rows if "val_loss" in r}
    return {"loss": loss, "val_ppl": ppl}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="re-record tests/assets/loss_baseline.json")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="yxanul-baseline-") as tmp:
        now = first_steps(STEPS, os.path.join(tmp, "first"))
        if not args.write:
            base = json.loads(BASELINE.read_text())["first_steps"]
            worst = max(abs(a - b) / abs(b) for a, b in zip(now["losses"] + [now["val_loss"]],
                                                          base["losses"] + [base["val_loss"]]))
            print(json.dumps({"dependency_set": dependency_set(), "machine": machine(), "max_rel_diff": worst, **now},
                             indent=1))
            return 0
        old = json.loads(BASELINE.read_text()) if BASELINE.exists() else {}
        record = {"dependency_set": dependency_set(), "machine": machine(), "first_steps": now,
                  "default_run": default_run(tmp + "/run"), "tolerance": old.get("tolerance")}
    BASELINE.parent.mkdir(parents=True, exist_ok=True)
    BASELINE.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {BASELINE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
