"""The work folder of `yxanul prepare`: what its cleaning may remove, and a data_dir it cannot create."""

import pytest

from yxanul.data.args import DataArgs
from yxanul.data.prepare import prepare
from yxanul.errors import DataError

Q = {"progress": False, "say": lambda *a, **k: None}


def test_only_this_outputs_legacy_temporaries_are_removed(tmp_path, docs_file):
    src, _ = docs_file(30)
    user = tmp_path / "thesis.tmp-draft"  # the user's: not a name yxanul ever made
    user.mkdir()
    (user / "ch1.tex").write_text("x")
    lookalike = tmp_path / "shards.tmp-abcd1234"  # the name of a legacy temporary, but the user's file inside
    lookalike.mkdir()
    (lookalike / "notes.txt").write_text("mine")
    other = tmp_path / "other.tmp-4242"  # a legacy temporary of another output
    other.mkdir()
    (other / "train_00000.bin").write_bytes(b"\0" * 64)
    legacy = [tmp_path / "shards.tmp-4242", tmp_path / "shards.tmp-x_9ab3kq"]  # pid and mkdtemp forms
    for p in legacy:
        (p / "tokenizer").mkdir(parents=True)
        (p / "tokenizer" / "tokenizer.json").write_text("{}")
        (p / ".datasets-cache").mkdir()
        for name in ("train_00000.bin", "val_00000.bin", "meta.json"):
            (p / name).write_bytes(b"\0" * 8)
    prepare(DataArgs(dataset=str(src), data_dir=str(tmp_path / "shards")), **Q)
    assert (user / "ch1.tex").read_text() == "x" and (lookalike / "notes.txt").read_text() == "mine"
    assert (other / "train_00000.bin").exists()
    assert not any(p.exists() for p in legacy)


@pytest.mark.parametrize("where", ["file", "proc"])
def test_a_data_dir_that_cannot_be_created_is_one_line(tmp_path, docs_file, where):
    src, _ = docs_file(30)
    out = src / "x" if where == "file" else "/proc/yxanul-x"
    with pytest.raises(DataError, match=r"^data_dir '.*yxanul-x|^data_dir '.*docs\.jsonl/x'") as e:
        prepare(DataArgs(dataset=str(src), data_dir=str(out)), **Q)
    assert "\n" not in str(e.value)
