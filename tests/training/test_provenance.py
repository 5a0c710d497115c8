"""`provenance`: what a resume checks it continues on, said in words where a fingerprint alone says nothing, and
decided by the prepared tokens where only the files' identity changed."""

import json
import os
import shutil

import pytest
from tiny_run import FAST

from yxanul.config import parse_args
from yxanul.errors import UserError
from yxanul.tracking import read_metrics
from yxanul.training import train
from yxanul.training.provenance import precheck


def _losses(run) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r}


def _dataset(path):
    path.write_text("".join(f'{{"text": "{"word " * 40}document {i}"}}\n' for i in range(60)))
    return path


def test_a_moved_or_touched_dataset_with_the_same_tokens_resumes_at_its_data_position(tmp_path, monkeypatch, capsys):
    """Copied to another cluster, moved or touched, a local dataset file gets another fingerprint (its path, size
    and modification time are in it) with every data setting the same. The resume was refused, or, allowed, read
    the data again from its start (tokens trained twice). The tokens decide now: prepared again to the same ones,
    the resume continues at its data position (the uninterrupted run's losses), with one note; other tokens
    under the same settings are refused, naming the dataset."""
    monkeypatch.setenv("YXANUL_CACHE", str(tmp_path / "cache"))
    data = _dataset(tmp_path / "a.jsonl")
    flags = [*FAST, "--warmup_steps", "0", "--lr_decay_steps", "6", "--val_fraction", "0.2", "--checkpoint_freq", "0"]
    train(parse_args([*flags, "--dataset", str(data), "--max_steps", "6", "--output_dir", str(tmp_path / "full")]),
          callbacks=[])
    part = [*flags, "--output_dir", str(tmp_path / "part")]
    train(parse_args([*part, "--dataset", str(data), "--max_steps", "3", "--save_final", "true"]), callbacks=[])
    moved = tmp_path / "elsewhere" / "a.jsonl"
    moved.parent.mkdir()
    shutil.copy(data, moved)
    st = data.stat()
    os.utime(moved, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    resume = parse_args([*part, "--dataset", str(moved), "--max_steps", "6", "--resume", "latest"])
    precheck(resume, tmp_path / "part")  # the files' identity only: `check` decides once the tokens are prepared
    capsys.readouterr()
    train(resume, callbacks=[])
    said = capsys.readouterr().out
    assert "prepared tokens are the same" in said and "continues at the saved data position" in said, said[-2000:]
    full, resumed = _losses(tmp_path / "full"), _losses(tmp_path / "part")
    assert [resumed[s] for s in (4, 5, 6)] == pytest.approx([full[s] for s in (4, 5, 6)], abs=1e-5)
    moved.write_text(moved.read_text().replace("document 7", "document seven"))  # other tokens, same settings
    again = parse_args([*part, "--dataset", str(moved), "--max_steps", "8", "--resume", "latest"])
    with pytest.raises(UserError, match=r"dataset: \w+ \(tokens \w+\) -> \w+ \(tokens \w+\).*"
                                        r"--resume_allow_changes dataset$"):
        train(again, callbacks=[])


def test_a_touched_source_of_an_older_checkpoint_is_named_as_the_reason_not_only_two_hashes(tmp_path, monkeypatch):
    """A checkpoint that records no token identity (an older yxanul): the refusal said `dataset: HASH -> HASH` and
    nothing else; it says what changed and what allowing it does, before anything is prepared."""
    monkeypatch.setenv("YXANUL_CACHE", str(tmp_path / "cache"))
    data = _dataset(tmp_path / "a.jsonl")
    argv = [*FAST, "--dataset", str(data), "--warmup_steps", "0", "--val_fraction", "0.2", "--output_dir",
            str(tmp_path / "run")]
    train(parse_args([*argv, "--max_steps", "2", "--save_final", "true"]), callbacks=[])
    record = next((tmp_path / "run" / "checkpoints").glob("step_*")) / "trained_on.json"
    record.write_text(json.dumps({k: v for k, v in json.loads(record.read_text()).items() if k != "dataset_content"}))
    resume = parse_args([*argv, "--max_steps", "4", "--resume", "latest"])
    precheck(resume, tmp_path / "run")  # untouched: nothing to refuse
    st = data.stat()
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(UserError, match=r"\(dataset: \w+ -> \w+ \(the same data settings: a source file was moved, "
                                        r"touched or changed since; .*\); if intended, add --resume_allow_changes "
                                        r"dataset$"):
        precheck(resume, tmp_path / "run")
