"""`save_checkpoint`: atomic at every stage of a crash, re-saving a step, keep_last and best pruning, a full
disk as one line (real accelerate save_state)."""

import pytest
import torch
from _checkpoint import _state

from yxanul.checkpoint import format_table, latest_good_checkpoint, list_checkpoints, resolve_resume, save_checkpoint
from yxanul.checkpoint.manifest import verify_checkpoint
from yxanul.errors import UserError


class Crash(Exception):
    pass


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
    save_checkpoint(acc, tmp_path, _state(6, 1.0), keep_last=2)  # ties the best: the first to reach it stays best
    assert (tmp_path / "checkpoints" / "best").read_text().strip() == "step_2"


def test_a_run_gone_back_to_an_older_checkpoint_keeps_its_own_and_falls_back_to_its_own(tmp_path, acc_model):
    """--resume RUN/checkpoints/step_8 past a step_12: the run going on keeps its newest keep_last (ranked with
    step_12, they were all pruned), step_12 stays until a save of the same step replaces it, and a damaged
    `latest` falls back to the run's own last save, not to step_12."""
    acc, _, _ = acc_model
    for step in (4, 8, 12):
        save_checkpoint(acc, tmp_path, _state(step), keep_last=2)
    for step in (9, 10, 11):  # trained on from step_8
        save_checkpoint(acc, tmp_path, _state(step), keep_last=2)
    assert [c["step"] for c in list_checkpoints(tmp_path)] == [10, 11, 12]
    (tmp_path / "checkpoints" / "step_11" / "model.safetensors").write_bytes(b"damaged")
    lines = []
    assert latest_good_checkpoint(tmp_path, say=lines.append).name == "step_10"
    assert "resuming from step_10, the newest checkpoint that verifies" in lines[-1]
    save_checkpoint(acc, tmp_path, _state(12), keep_last=2)  # the same step again: the old step_12 is replaced
    assert [c["step"] for c in list_checkpoints(tmp_path)] == [11, 12]


def test_a_crash_while_pruning_never_lists_a_half_deleted_checkpoint(tmp_path, acc_model):
    acc, _, _ = acc_model
    for step in (1, 2):
        save_checkpoint(acc, tmp_path, _state(step), keep_last=1)

    def crash(stage):
        if stage == "in_prune":
            raise Crash(stage)

    with pytest.raises(Crash):
        save_checkpoint(acc, tmp_path, _state(3), keep_last=1, _fault=crash)
    root = tmp_path / "checkpoints"
    assert (root / ".del-step_2").is_dir()  # renamed first, then deleted: never listed as step_2
    assert [c["step"] for c in list_checkpoints(tmp_path)] == [3]
    assert all(verify_checkpoint(c["path"]) == [] for c in list_checkpoints(tmp_path))
    save_checkpoint(acc, tmp_path, _state(4), keep_last=1)
    assert not list(root.glob(".del-*")) and [c["step"] for c in list_checkpoints(tmp_path)] == [4]


def test_best_without_a_val_loss_never_crashes(tmp_path, acc_model):
    """`best` names a checkpoint re-saved without an eval (val_loss null): issue 17 item 2."""
    acc, _, _ = acc_model
    save_checkpoint(acc, tmp_path, _state(5, 3.0), keep_last=5)
    save_checkpoint(acc, tmp_path, _state(5, None), keep_last=5)  # re-saved after a resume, no eval
    save_checkpoint(acc, tmp_path, _state(10, 2.5), keep_last=1)
    assert (tmp_path / "checkpoints" / "best").read_text().strip() == "step_10"
    assert [c["step"] for c in list_checkpoints(tmp_path)] == [10]


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_disk_full_is_one_line_removes_the_partial_save_and_keeps_the_previous(tmp_path, acc_model):
    acc, before = _saved_then_changed(tmp_path, acc_model)

    def fill(d):  # a real ENOSPC from the kernel, inside the real save path
        with open("/dev/full", "wb") as f:
            f.write(b"x" * 4096)
            f.flush()

    with pytest.raises(UserError) as e:
        save_checkpoint(acc, tmp_path, _state(20), keep_last=3, extra=fill)
    msg = str(e.value)
    root = tmp_path / "checkpoints"
    assert msg.startswith("disk full: saving checkpoint step_20 into ") and str(root) in msg and "\n" not in msg
    assert "needs about " in msg and " bytes" in msg and "step_10 is intact" in msg
    assert not (root / ".tmp-step_20").exists() and [c["step"] for c in list_checkpoints(tmp_path)] == [10]
    assert (root / "step_10" / "model.safetensors").read_bytes() == before and verify_checkpoint(root / "step_10") == []


def test_the_weights_files_get_the_mode_of_the_checkpoints_other_files(tmp_path, acc_model):
    """safetensors writes model.safetensors (and the FP8 state an ``extra`` writes) through a private temporary
    file, mode 0600, while the checkpoint's other files follow the umask (0644 under 022): another user who may
    read the run could read its config and not its weights. Every file of the checkpoint now has the one mode."""
    import os

    from safetensors.torch import save_file

    from yxanul.precision.state import FILE as FP8_STATE

    acc, _, _ = acc_model
    old = os.umask(0o022)
    try:
        ckpt = save_checkpoint(acc, tmp_path, _state(10), keep_last=3,
                               extra=lambda d: save_file({"scale": torch.ones(1)}, str(d / FP8_STATE)))
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in ckpt.iterdir()}
    assert {"model.safetensors", FP8_STATE, "optimizer.bin", "trainer_state.json"} <= set(modes)
    assert set(modes.values()) == {0o644}, modes
    assert verify_checkpoint(ckpt) == []
