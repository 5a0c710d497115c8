"""`prepare_run_dir`: the run directory's names settled once, and what would lose or misplace work refused
as one line before anything is built (the same guards through the CLI: tests/training/test_trainer.py)."""

import re
from pathlib import Path

import pytest
from _checkpoint import _state

from yxanul.checkpoint import prepare_run_dir, run_dir_of, save_checkpoint
from yxanul.config import parse_args
from yxanul.errors import UserError


def test_the_names_are_settled_once_and_the_config_is_left_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = parse_args(["--model", "nano"])
    run_dir, settled = prepare_run_dir(cfg)
    assert settled.run_name.startswith("nano-") and run_dir == Path("runs") / settled.run_name
    assert settled.output_dir == str(run_dir) and not run_dir.exists()  # nothing is created here
    assert cfg.checkpoint.run_name is None and cfg.checkpoint.output_dir is None  # the trainer records them
    assert run_dir_of(parse_args(["--run_name", "r"])) == Path("runs") / "r"


def test_what_would_lose_or_misplace_work_is_one_line(tmp_path, acc_model):
    out, typo = tmp_path / "run", tmp_path / "typo"
    acc, _, _ = acc_model
    save_checkpoint(acc, out, _state(2), keep_last=3)
    (tmp_path / "file").write_text("x")
    (tmp_path / "has_file").mkdir()
    (tmp_path / "has_file" / "checkpoints").write_text("x")
    for flags, needle in [
        (["--output_dir", str(out)], f"output_dir '{out}' already holds checkpoints (newest: step 2): add "
                                     "--resume latest"),
        (["--resume", "latest"], "resume 'latest': set --output_dir or --run_name too"),
        (["--resume", "latest", "--output_dir", str(typo)], f"resume 'latest': no checkpoint under '{typo}'"),
        (["--resume", str(typo / "step_3"), "--output_dir", str(out)], "no such checkpoint or run directory"),
        (["--output_dir", str(tmp_path / "file" / "run")], f"'{tmp_path / 'file'}' exists and is not a directory"),
        (["--output_dir", str(tmp_path / "has_file")], f"output_dir '{tmp_path / 'has_file'}': '"
         f"{tmp_path / 'has_file' / 'checkpoints'}' exists and is not a directory (the run keeps its checkpoints in "
         "that folder)"),  # found at the first save before: after data preparation and the first checkpoint_freq steps
    ]:
        with pytest.raises(UserError, match=re.escape(needle)) as e:
            prepare_run_dir(parse_args(flags))
        assert "\n" not in str(e.value), flags
    assert not typo.exists()
    for flags in (["--resume", "latest"], ["--resume", "auto"], ["--resume", str(out / "checkpoints" / "step_2")]):
        assert prepare_run_dir(parse_args([*flags, "--output_dir", str(out)]))[0] == out
    assert prepare_run_dir(parse_args(["--resume", "auto", "--output_dir", str(typo)]))[0] == typo  # starts fresh


def test_a_resume_from_another_run_into_one_with_checkpoints_is_one_line(tmp_path, acc_model):
    """It would move that run's `latest`, prune its checkpoints and rank its `best` among another run's."""
    acc, _, _ = acc_model
    mine, other = tmp_path / "mine", tmp_path / "other"
    save_checkpoint(acc, mine, _state(5), keep_last=3)
    save_checkpoint(acc, other, _state(3), keep_last=3)
    for resume in (other / "checkpoints" / "step_3", other):
        with pytest.raises(UserError, match=re.escape(f"output_dir '{mine}' already holds checkpoints of another run "
                                                      f"than resume '{resume}' (newest: step 5)")):
            prepare_run_dir(parse_args(["--resume", str(resume), "--output_dir", str(mine)]))
    fresh = tmp_path / "fresh"  # another run's checkpoint into an empty directory: a new run started from it
    assert prepare_run_dir(parse_args(["--resume", str(other / "checkpoints" / "step_3"),
                                       "--output_dir", str(fresh)]))[0] == fresh
    assert prepare_run_dir(parse_args(["--resume", str(mine), "--output_dir", str(mine)]))[0] == mine


def test_a_run_directory_inside_a_checkpoints_folder_or_a_checkpoint_is_one_line(tmp_path, acc_model):
    """A new run there would overwrite the checkpoint's config.yaml (it then fails verification) or be pruned with
    it: refused before anything is written, the checkpoint still verifying."""
    from yxanul.checkpoint import verify_checkpoint

    acc, _, _ = acc_model
    run = tmp_path / "run"
    save_checkpoint(acc, run, _state(2), keep_last=3)
    ckpt = run / "checkpoints" / "step_2"
    moved = tmp_path / "loose_step"  # a checkpoint folder copied out of its run
    moved.mkdir()
    (moved / "trainer_state.json").write_text((ckpt / "trainer_state.json").read_text())
    for out, needle in [(ckpt, f"inside the checkpoints folder of the run '{run.resolve()}'"),
                        (run / "checkpoints" / "new", "inside the checkpoints folder"),
                        (moved, "a checkpoint folder, not a run directory")]:
        before = sorted(p.name for p in out.iterdir()) if out.exists() else None
        with pytest.raises(UserError, match=re.escape(f"output_dir '{out}': {needle}")):
            prepare_run_dir(parse_args(["--output_dir", str(out), "--resume", "auto"]))
        assert (sorted(p.name for p in out.iterdir()) if out.exists() else None) == before
    assert verify_checkpoint(ckpt) == []
