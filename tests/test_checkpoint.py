"""Atomic checkpoints, pointers, pruning and the listing table (real accelerate save_state)."""

import subprocess
import sys

import pytest
import torch
from accelerate import Accelerator

from yxanul.checkpoint import format_table, list_checkpoints, resolve_resume, save_checkpoint
from yxanul.errors import UserError


class Crash(Exception):
    pass


@pytest.fixture
def acc_model():
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    model, opt = acc.prepare(model, opt)
    return acc, model, opt


def _state(step, val=None):
    return {"step": step, "tokens_seen": step * 100, "data": {"position": step}, "val_loss": val,
            "precision": "FP32", "backend": "torch"}


def _saved_then_changed(tmp_path, acc_model):
    """Save step 10, then change the weights; returns the accelerator and step 10's weight bytes."""
    acc, model, _ = acc_model
    save_checkpoint(acc, tmp_path, _state(10), keep_last=3)
    before = (tmp_path / "checkpoints" / "step_10" / "model.safetensors").read_bytes()
    with torch.no_grad():
        model.weight.add_(1.0)
    return acc, before


def test_crash_mid_save_keeps_previous(tmp_path, acc_model):
    acc, before = _saved_then_changed(tmp_path, acc_model)

    def crash(stage):
        raise Crash(stage)

    with pytest.raises(Crash):
        save_checkpoint(acc, tmp_path, _state(20), keep_last=3, _fault=crash)
    # the half-written save is not a checkpoint; latest still points to the intact one
    assert [c["step"] for c in list_checkpoints(tmp_path)] == [10]
    assert resolve_resume("latest", tmp_path).name == "step_10"
    assert (tmp_path / "checkpoints" / "step_10" / "model.safetensors").read_bytes() == before
    assert (tmp_path / "checkpoints" / ".tmp-step_20").exists()
    # the next save cleans up the leftovers
    save_checkpoint(acc, tmp_path, _state(30), keep_last=3)
    assert not (tmp_path / "checkpoints" / ".tmp-step_20").exists()
    assert resolve_resume("latest", tmp_path).name == "step_30"


def test_crash_while_replacing_a_step_keeps_the_old_copy(tmp_path, acc_model):
    """Re-saving an existing step (training again from an older checkpoint): the old copy is moved
    aside, never deleted before the new one is in place; a crash in between leaves it resumable."""
    acc, before = _saved_then_changed(tmp_path, acc_model)

    def crash(stage):
        if stage == "after_swap":
            raise Crash(stage)

    with pytest.raises(Crash):
        save_checkpoint(acc, tmp_path, _state(10), keep_last=3, _fault=crash)
    assert [c["step"] for c in list_checkpoints(tmp_path)] == [10]
    old = resolve_resume("latest", tmp_path)
    assert old.name == ".old-step_10" and (old / "model.safetensors").read_bytes() == before
    save_checkpoint(acc, tmp_path, _state(20), keep_last=3)  # the next save puts it back
    assert [c["path"].rsplit("/", 1)[1] for c in list_checkpoints(tmp_path)] == ["step_10", "step_20"]
    assert (tmp_path / "checkpoints" / "step_10" / "model.safetensors").read_bytes() == before
    save_checkpoint(acc, tmp_path, _state(10), keep_last=3)  # a clean replace leaves no .old-*
    assert not list((tmp_path / "checkpoints").glob(".old-*"))
    assert (tmp_path / "checkpoints" / "step_10" / "model.safetensors").read_bytes() != before


def test_keep_last_and_best(tmp_path, acc_model):
    acc, _, _ = acc_model
    for step, val in [(1, 3.0), (2, 1.0), (3, 2.0), (4, 2.5), (5, 2.6)]:
        save_checkpoint(acc, tmp_path, _state(step, val), keep_last=2)
    steps = [c["step"] for c in list_checkpoints(tmp_path)]
    assert steps == [2, 4, 5]  # last two + best (val 1.0)
    table = format_table(tmp_path)
    assert "best" in table.splitlines()[1] and "latest" in table.splitlines()[-1]


def test_resume_errors(tmp_path):
    assert resolve_resume("latest", tmp_path) is None
    with pytest.raises(UserError, match="not a checkpoint"):
        resolve_resume(str(tmp_path / "nothing"), tmp_path)


def test_checkpoints_cli(tmp_path, acc_model):
    acc, _, _ = acc_model
    save_checkpoint(acc, tmp_path, _state(7, 2.0), keep_last=2)
    r = subprocess.run([sys.executable, "-m", "yxanul", "checkpoints", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0 and "step_7" in r.stdout
    r = subprocess.run([sys.executable, "-m", "yxanul", "checkpoints", str(tmp_path / "x")], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error: run directory")
