"""`yxanul checkpoints`: the listing of a run's checkpoints, one line for a missing run directory."""

import subprocess
import sys

import pytest
from _checkpoint import _state

from yxanul.checkpoint import save_checkpoint
from yxanul.errors import UserError


def test_checkpoints_cli(tmp_path, acc_model):
    acc, _, _ = acc_model
    save_checkpoint(acc, tmp_path, _state(7, 2.0), keep_last=2)
    r = subprocess.run([sys.executable, "-m", "yxanul", "checkpoints", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0 and "step_7" in r.stdout
    r = subprocess.run([sys.executable, "-m", "yxanul", "checkpoints", str(tmp_path / "x")], capture_output=True,
                       text=True)
    assert r.returncode == 2 and r.stderr.startswith("error: run directory")


def test_a_checkpoint_or_the_checkpoints_folder_lists_its_run(tmp_path, acc_model, capsys):
    """Given the folder a user is looking at (`RUN/checkpoints` or one checkpoint), not the run directory: the
    run's table, said so, instead of "no checkpoints under RUN/checkpoints/checkpoints"."""
    from yxanul.checkpoint.table import main

    acc, _, _ = acc_model
    save_checkpoint(acc, tmp_path, _state(7, 2.0), keep_last=2)
    for given in (tmp_path / "checkpoints", tmp_path / "checkpoints" / "step_7"):
        assert main([str(given)]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"'{given}' is inside the run directory {tmp_path.resolve()}") and "step_7" in out, out
    latest = tmp_path / "checkpoints" / "latest"
    for bad, why in ((tmp_path / "nope", "no such directory"), (latest, "not a directory")):
        with pytest.raises(UserError, match=f"run directory '{bad}': {why}"):  # train --list_checkpoints too
            main([str(bad)])


def test_a_checkpoint_pruned_while_the_table_is_made_is_no_row_and_no_traceback(tmp_path, acc_model, monkeypatch):
    """A training's keep_last deletes a checkpoint between `yxanul checkpoints`' listing and its hashing (seen: 3 %
    of calls on a run saving every step raised FileNotFoundError): that one is left out, the others verify."""
    import shutil

    from yxanul.checkpoint import table

    acc, _, _ = acc_model
    for step in (1, 2, 3):
        save_checkpoint(acc, tmp_path, _state(step, 2.0), keep_last=5)
    listed = table.list_checkpoints

    def listed_then_pruned(run_dir):
        out = listed(run_dir)
        shutil.rmtree(tmp_path / "checkpoints" / "step_1")  # what the pruner does after the listing
        return out

    monkeypatch.setattr(table, "list_checkpoints", listed_then_pruned)
    text = table.format_table(tmp_path)
    assert "step_1" not in text and "step_2" in text and "step_3" in text and "DAMAGED" not in text, text


def test_train_list_checkpoints_prints_the_table_on_rank_0_only(tmp_path, acc_model, capsys, monkeypatch):
    """`accelerate launch train.py --list_checkpoints` starts every rank with the flag: the job prints one table,
    rank 0's (RANK as the launcher sets it), not one per process."""
    from yxanul.cli import train_main

    acc, _, _ = acc_model
    save_checkpoint(acc, tmp_path, _state(7, 2.0), keep_last=2)
    printed = {}
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        assert train_main(["--list_checkpoints", "--output_dir", str(tmp_path)]) == 0
        printed[rank] = capsys.readouterr().out
    assert "step_7" in printed["0"] and printed["1"] == "", printed
