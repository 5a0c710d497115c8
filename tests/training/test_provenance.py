"""`provenance`: what a resume checks it continues on, said in words where a fingerprint alone says nothing."""

import os

import pytest
from tiny_run import FAST

from yxanul.config import parse_args
from yxanul.errors import UserError
from yxanul.training import train
from yxanul.training.provenance import precheck


def test_a_touched_source_file_is_named_as_the_reason_not_only_two_hashes(tmp_path, monkeypatch):
    """Copied to another volume or touched, a local dataset file gets another fingerprint (its path, size and
    modification time are in it) with every data setting the same: the refusal said `dataset: HASH -> HASH`
    and nothing else. It now says what changed and what allowing it does."""
    monkeypatch.setenv("YXANUL_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "a.jsonl"
    data.write_text("".join(f'{{"text": "document {i} " }}\n'.replace("document", "word " * 40) for i in range(60)))
    argv = [*FAST, "--dataset", str(data), "--warmup_steps", "0", "--val_fraction", "0.2", "--output_dir",
            str(tmp_path / "run")]
    train(parse_args([*argv, "--max_steps", "2", "--save_final", "true"]), callbacks=[])
    resume = parse_args([*argv, "--max_steps", "4", "--resume", "latest"])
    precheck(resume, tmp_path / "run")  # untouched: nothing to refuse
    st = data.stat()
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(UserError, match=r"\(dataset: \w+ -> \w+ \(the same data settings: a source file was moved, "
                                        r"touched or changed since; .*\); if intended, add --resume_allow_changes "
                                        r"dataset$"):
        precheck(resume, tmp_path / "run")
