"""`yxanul checkpoints`: the listing of a run's checkpoints, one line for a missing run directory."""

import subprocess
import sys

from _checkpoint import _state

from yxanul.checkpoint import save_checkpoint


def test_checkpoints_cli(tmp_path, acc_model):
    acc, _, _ = acc_model
    save_checkpoint(acc, tmp_path, _state(7, 2.0), keep_last=2)
    r = subprocess.run([sys.executable, "-m", "yxanul", "checkpoints", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0 and "step_7" in r.stdout
    r = subprocess.run([sys.executable, "-m", "yxanul", "checkpoints", str(tmp_path / "x")], capture_output=True,
                       text=True)
    assert r.returncode == 2 and r.stderr.startswith("error: run directory")
