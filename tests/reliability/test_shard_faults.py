"""Token shards are checked before step 1: a changed byte (sha256 in meta.json's manifest) or a token id
outside the vocabulary is one line naming the shard, exit 2, nothing trained; an older folder without
checksums still trains, with one line; an unchanged folder is hashed once, not at every start."""

import json
import shutil

import numpy as np
import pytest
from _reliability import ok, one_line, yx_here
from tiny_run import FAST

from yxanul.data.args import DataArgs
from yxanul.data.prepare import prepare
from yxanul.data.shards import HEADER


@pytest.fixture(scope="module")
def prepared_once(tmp_path_factory):
    d = tmp_path_factory.mktemp("shards") / "d"
    return prepare(DataArgs(data_dir=str(d), max_documents=40, val_fraction=0.2, prepare_num_proc=1),
                   progress=False, say=lambda *a, **k: None)


@pytest.fixture
def data(prepared_once, tmp_path):
    d = tmp_path / "d"
    shutil.copytree(prepared_once, d)
    return d


def _train(data, out, *more):
    return yx_here("train", *FAST, "--max_steps", "2", "--checkpoint_freq", "0", "--data_dir", data,
                   "--output_dir", out, *more)


def _poke(path, index: int, value: int) -> None:
    """Token ``index`` of a shard set to ``value`` in place (the file keeps its size)."""
    tokens = np.memmap(path, dtype=np.uint16, mode="r+", offset=HEADER)
    tokens[index] = value
    tokens.flush()


def test_a_flipped_bit_in_a_cached_train_shard_stops_before_step_1(data, tmp_path):
    shard = data / "train_00000.bin"
    tokens = np.memmap(shard, dtype=np.uint16, mode="r", offset=HEADER)
    _poke(shard, 1000, int(tokens[1000]) ^ 1)  # the lowest bit: still a valid id
    r = _train(data, tmp_path / "r")
    one_line(r, 2, f"shard '{shard}': its contents changed since `yxanul prepare`")
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def test_a_shard_edited_after_it_verified_with_its_mtime_kept_is_hashed_again(data, tmp_path):
    """``touch -d``/``os.utime``/``cp -p`` set an mtime back; the ctime in verified.json's key moves anyway."""
    import os

    from yxanul.data import verify

    verify.verified(data, say=None)  # a first run start: the copy is recorded as verified
    shard = data / "train_00000.bin"
    before = shard.stat()
    tokens = np.memmap(shard, dtype=np.uint16, mode="r", offset=HEADER)
    _poke(shard, 1000, int(tokens[1000]) ^ 1)  # still a valid id: only the hash can tell
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    r = _train(data, tmp_path / "r")
    one_line(r, 2, f"shard '{shard}': its contents changed since `yxanul prepare`")


def test_an_id_outside_the_vocabulary_in_the_val_shard_stops_before_step_1(data, tmp_path):
    """Even where the checksum was recomputed over the bad id (or was never recorded): the id is checked."""
    import hashlib

    shard = data / "val_00000.bin"
    _poke(shard, 5, 9000)  # vocabulary 8192
    meta = json.loads((data / "meta.json").read_text())
    meta["splits"]["val"]["manifest"][0]["sha256"] = hashlib.sha256(shard.read_bytes()[HEADER:]).hexdigest()
    (data / "meta.json").write_text(json.dumps(meta))
    r = _train(data, tmp_path / "r")
    one_line(r, 2, f"shard '{shard}': holds token id 9000, outside the model's vocabulary of 8192")
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def test_an_older_folder_without_checksums_trains_with_one_line(data, tmp_path):
    meta = json.loads((data / "meta.json").read_text())
    for split in meta["splits"].values():
        for e in split["manifest"]:
            del e["sha256"], e["max_id"]
    (data / "meta.json").write_text(json.dumps(meta))
    (data / "verified.json").unlink()
    r = ok(_train(data, tmp_path / "r"))
    assert r.stdout.count("without shard checksums (2 shards): token ids checked only") == 1


def test_a_verified_folder_is_not_read_again_but_a_changed_file_is(prepared_once, data, monkeypatch):
    from yxanul.data import verify

    scanned = []
    real = verify._scan
    monkeypatch.setattr(verify, "_scan", lambda p: scanned.append(p.name) or real(p))
    verify.verified(prepared_once, say=None)
    assert scanned == []  # prepare recorded its own hashes
    verify.verified(data, say=None)  # a copy: other inodes and mtimes, hashed once
    assert scanned == ["train_00000.bin", "val_00000.bin"]
    scanned.clear()
    verify.verified(data, say=None)
    assert scanned == []
    shard = data / "val_00000.bin"
    _poke(shard, 5, int(np.memmap(shard, dtype=np.uint16, mode="r", offset=HEADER)[5]))  # same bytes, new mtime
    verify.verified(data, say=None)
    assert scanned == ["val_00000.bin"]
    verify.verified(data, say=None)
    assert scanned == ["val_00000.bin"]
