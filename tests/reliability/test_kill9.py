"""kill -9 at seeded random moments, inside saves and prunes included: what is listed always verifies,
and the run resumes bit-identically (issue 17 item 7)."""

import random
import signal
import subprocess
import sys
import time

import pytest
from _reliability import env, losses, ok, popen, yx_here
from tiny_run import FAST

from yxanul.checkpoint import latest_good_checkpoint, list_checkpoints
from yxanul.checkpoint.manifest import verify_checkpoint

SEED = 17

_SAVER = """
import sys, torch
from accelerate import Accelerator
from yxanul.checkpoint import latest_good_checkpoint, read_state, save_checkpoint
run = sys.argv[1]
acc = Accelerator(cpu=True)
model, opt = acc.prepare(torch.nn.Linear(512, 512), torch.optim.AdamW(torch.nn.Linear(1, 1).parameters()))
last = latest_good_checkpoint(run, say=None)
step = read_state(last)["step"] if last else 0
print("READY", flush=True)
while True:  # save and prune back to back: a kill lands inside one or the other most of the time
    step += 1
    with torch.no_grad():
        model.weight.add_(1.0)
    save_checkpoint(acc, run, {"step": step, "data": {"position": step}, "val_loss": float(step % 3)}, keep_last=1)
"""


def _assert_consistent(run):
    listed = list_checkpoints(run)
    assert all(verify_checkpoint(c["path"]) == [] for c in listed), [(c["path"], verify_checkpoint(c["path"]))
                                                                   for c in listed]
    return latest_good_checkpoint(run, say=None)


@pytest.mark.slow
def test_kill9_inside_save_and_prune_never_leaves_a_listed_damaged_checkpoint(tmp_path):
    rng = random.Random(SEED)
    run, steps = tmp_path / "run", []
    for _ in range(5):
        p = subprocess.Popen([sys.executable, "-c", _SAVER, str(run)], stdout=subprocess.PIPE, text=True, env=env())
        assert p.stdout.readline().strip() == "READY"
        time.sleep(rng.uniform(0.2, 2.0))
        p.send_signal(signal.SIGKILL)
        assert p.wait(timeout=30) == -signal.SIGKILL
        good = _assert_consistent(run)
        assert good is not None or not steps
        steps.append(int(good.name.split("_")[-1]) if good else 0)
    assert steps == sorted(steps) and steps[-1] > 0  # never went back: the last good one was never deleted


@pytest.mark.slow
def test_kill9_during_training_resumes_bit_identically(base_run, tmp_path):
    """Checkpoint and prune at every step; two kills at seeded random moments; then resume to the end.
    The losses of every step equal the uninterrupted run's (base_run, same settings but saves)."""
    rng = random.Random(SEED)
    out = tmp_path / "run"
    args = [*FAST, "--max_steps", "8", "--checkpoint_freq", "1", "--keep_last", "2", "--output_dir", str(out)]
    for i in range(2):
        p = popen("train", *args, *(["--resume", "latest"] if i else []), start_new_session=True)
        for line in p.stdout:
            if line.startswith("step "):
                break
        time.sleep(rng.uniform(0.0, 1.5))
        p.send_signal(signal.SIGKILL)
        assert p.wait(timeout=30) == -signal.SIGKILL, "the run ended before the kill: it tested nothing"
        _assert_consistent(out)
    ok(yx_here("train", *args, "--resume", "latest"))  # the rest in this process, like base_run
    assert losses(out) == losses(base_run)
