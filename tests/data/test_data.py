"""Data on real code paths: sources, prepare/packing, shards, loader determinism and exact resume."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from yxanul.data.args import DataArgs
from yxanul.data.loader import WindowLoader, eval_batches
from yxanul.data.prepare import load_tokenizer, prepare
from yxanul.data.shards import open_shard, write_shard
from yxanul.errors import DataError


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("YXANUL_CACHE", str(tmp_path / "cache"))


def docs_file(tmp_path, n=60):
    p = tmp_path / "docs.jsonl"
    docs = [f"Document {i}: " + " ".join(f"word{j % 17}" for j in range(i % 23 + 5)) for i in range(n)]
    p.write_text("\n".join(json.dumps({"text": d, "id": i}) for i, d in enumerate(docs)))
    return p, docs


def test_shard_round_trip_and_bad_files(tmp_path):
    for dtype in (np.uint16, np.uint32):
        a = np.arange(1000, dtype=dtype) * 7
        write_shard(tmp_path / "s.bin", a)
        assert np.array_equal(open_shard(tmp_path / "s.bin"), a)
    (tmp_path / "bad.bin").write_bytes(b"nope" * 20)
    with pytest.raises(DataError, match="bad.bin.*not a yxanul token shard"):
        open_shard(tmp_path / "bad.bin")
    data = (tmp_path / "s.bin").read_bytes()
    (tmp_path / "trunc.bin").write_bytes(data[:-10])
    with pytest.raises(DataError, match="truncated"):
        open_shard(tmp_path / "trunc.bin")


def test_prepare_packs_documents_with_eos_and_disjoint_val(tmp_path):
    path, docs = docs_file(tmp_path)
    out = prepare(DataArgs(dataset=str(path), val_fraction=0.1, data_dir=str(tmp_path / "d")), progress=False,
                  say=lambda *a: None)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["dtype"] == "uint16" and meta["splits"]["val"]["documents"] >= 1
    _, tok = load_tokenizer(None)
    texts = []
    for split in ("train", "val"):
        toks = np.concatenate([open_shard(out / f) for f in meta["splits"][split]["shards"]]).tolist()
        assert toks[-1] == tok.eos_token_id
        parts, cur = [], []
        for t in toks:
            if t == tok.eos_token_id:
                parts.append(tok.decode(cur))
                cur = []
            else:
                cur.append(t)
        texts.append(parts)
    train, val = texts
    assert sorted(train + val) == sorted(docs) and not set(train) & set(val)
    # idempotent: same folder reused, nothing rewritten
    mtime = (out / "meta.json").stat().st_mtime_ns
    assert prepare(DataArgs(dataset=str(path), val_fraction=0.1, data_dir=str(tmp_path / "d")), progress=False,
                   say=lambda *a: None) == out
    assert (out / "meta.json").stat().st_mtime_ns == mtime


@pytest.mark.parametrize("make,needle", [
    (lambda p: p / "missing.txt", "no such file"),
    (lambda p: (p / "empty.txt").write_text("") or p / "empty.txt", "empty"),
    (lambda p: (p / "latin1.txt").write_bytes("caf\xe9 ok".encode("latin-1")) and p / "latin1.txt",
     "not UTF-8 text \\(invalid byte at offset 3\\)"),
    (lambda p: p / "*.nothing", "matches no file"),
])
def test_source_errors_name_the_file(tmp_path, make, needle):
    target = make(tmp_path)
    with pytest.raises(DataError, match=needle):
        prepare(DataArgs(dataset=str(target)), progress=False, say=lambda *a: None)


def test_missing_text_column(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"body": "hello there"}\n')
    with pytest.raises(DataError, match="no column 'text' \\(columns: body\\)"):
        prepare(DataArgs(dataset=str(p)), progress=False, say=lambda *a: None)


def test_parquet_glob_and_mixture(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    for i in range(2):
        pq.write_table(pa.table({"text": [f"parquet doc {i}-{j} " * 5 for j in range(40)], "extra": list(range(40))}),
                       tmp_path / f"part{i}.parquet")
    out = prepare(DataArgs(dataset=str(tmp_path / "*.parquet"), val_fraction=0.05), progress=False, say=lambda *a: None)
    assert json.loads((out / "meta.json").read_text())["splits"]["train"]["documents"] > 60
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join(json.dumps({"text": f"alpha {i}"}) for i in range(400)))
    b.write_text("\n".join(json.dumps({"text": f"beta {i}", "other": 1}) for i in range(400)))
    out = prepare(DataArgs(datasets=[{"path": str(a), "weight": 0.8}, {"path": str(b), "weight": 0.2}],
                           val_fraction=0.01, max_documents=300), progress=False, say=lambda *a: None)
    _, tok = load_tokenizer(None)
    meta = json.loads((out / "meta.json").read_text())
    text = tok.decode(np.concatenate([open_shard(out / f) for f in meta["splits"]["train"]["shards"]]).tolist())
    n_a, n_b = text.count("alpha"), text.count("beta")
    assert 0.65 < n_a / (n_a + n_b) < 0.92


def test_prepare_cli_error_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "yxanul", "prepare", "--dataset", str(tmp_path / "missing.txt")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and r.stderr.startswith("error: dataset file")


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    return prepare(DataArgs(data_dir=str(tmp_path_factory.mktemp("b") / "d")), progress=False, say=lambda *a: None)


def test_bundled_corpus_size(bundled):
    meta = json.loads((bundled / "meta.json").read_text())
    assert 1_300_000 < meta["splits"]["train"]["tokens"] < 1_700_000 and meta["vocab_size"] == 8192


def _take(loader, n):
    it = iter(loader)
    return [next(it) for _ in range(n)]


def test_loader_determinism_and_shift(bundled):
    a = _take(WindowLoader(bundled, "train", 64, 4, seed=1), 3)
    b = _take(WindowLoader(bundled, "train", 64, 4, seed=1), 3)
    c = _take(WindowLoader(bundled, "train", 64, 4, seed=2), 3)
    assert all(torch.equal(x[0], y[0]) for x, y in zip(a, b))
    assert not torch.equal(a[0][0], c[0][0])
    x, y = a[0]
    assert x.shape == y.shape == (4, 64) and torch.equal(x[:, 1:], y[:, :-1])


@pytest.mark.parametrize("workers", [0, 2])
def test_exact_resume(bundled, workers):
    ref = _take(WindowLoader(bundled, "train", 64, 4, seed=3), 8)
    l1 = WindowLoader(bundled, "train", 64, 4, seed=3, num_workers=workers)
    _take(l1, 5)
    state = l1.state_dict()
    assert state["position"] == 5 * 4
    l2 = WindowLoader(bundled, "train", 64, 4, seed=3, num_workers=workers)
    l2.load_state_dict(state)
    assert all(torch.equal(r[0], n[0]) for r, n in zip(ref[5:], _take(l2, 3)))


def test_world_size_change(bundled):
    one = _take(WindowLoader(bundled, "train", 64, 4, seed=5), 2)
    r0 = _take(WindowLoader(bundled, "train", 64, 2, seed=5, rank=0, world_size=2), 2)
    r1 = _take(WindowLoader(bundled, "train", 64, 2, seed=5, rank=1, world_size=2), 2)
    for k in range(2):
        assert torch.equal(one[k][0], torch.cat([r0[k][0], r1[k][0]]))
    two = WindowLoader(bundled, "train", 64, 2, seed=5, rank=0, world_size=2)
    _take(two, 1)
    solo = WindowLoader(bundled, "train", 64, 4, seed=5)
    solo.load_state_dict(two.state_dict())
    assert torch.equal(_take(solo, 1)[0][0], one[1][0])


def test_epoch_wraparound(tmp_path):
    path, _ = docs_file(tmp_path, n=30)
    out = prepare(DataArgs(dataset=str(path), val_fraction=0.1), progress=False, say=lambda *a: None)
    loader = WindowLoader(out, "train", 8, 2, seed=0)
    steps = loader._ds.steps_per_epoch
    batches = _take(loader, 2 * steps + 1)
    assert loader.epoch == 2
    first = torch.cat([b[0] for b in batches[:steps]])
    second = torch.cat([b[0] for b in batches[steps:2 * steps]])
    assert not torch.equal(first, second)  # a new permutation each epoch


def test_eval_batches_fixed_and_errors(bundled):
    a, b = list(eval_batches(bundled, 64, 4, 3)), list(eval_batches(bundled, 64, 4, 3))
    assert len(a) == 3 and all(torch.equal(x[0], y[0]) for x, y in zip(a, b))
    with pytest.raises(DataError, match="val split has 15285 tokens; need at least"):
        list(eval_batches(bundled, 60_000, 1, 1))
