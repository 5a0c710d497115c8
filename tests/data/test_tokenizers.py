"""`yxanul tokenizer train` and large-vocabulary (SuperBPE-sized) tokenizers through prepare + loader."""

import json
import re

import numpy as np
import pytest

from yxanul.data.args import DataArgs
from yxanul.data.loader import WindowLoader
from yxanul.data.prepare import prepare
from yxanul.data.shards import open_shard
from yxanul.data.tokenizer_load import load_prepared_tokenizer
from yxanul.data.tokenizer_train import main as tokenizer_main
from yxanul.errors import ConfigError, DataError

Q = {"progress": False, "say": lambda *a, **k: None}


def test_tokenizer_train_is_autotokenizer_loadable_and_reports_bytes_per_token(tmp_path, capsys):
    from transformers import AutoTokenizer

    out = tmp_path / "tok"
    assert tokenizer_main(["train", "--out", str(out), "--vocab_size", "600", "--sample_bytes", "300000",
                           "--special_tokens", "<|endoftext|>", "<|pad|>", "--held_out_documents", "5"]) == 0
    tok = AutoTokenizer.from_pretrained(out)
    assert len(tok) == 600 and tok.eos_token == "<|endoftext|>" and tok.convert_tokens_to_ids("<|pad|>") == 1
    text = "ROMEO: But soft, what light through yonder window breaks? naïve 東京"
    assert tok.decode(tok(text)["input_ids"]) == text  # byte-level: every string round-trips
    report = json.loads((out / "yxanul_tokenizer_report.json").read_text())
    assert report["held_out_documents"] == 5 and 0 < report["sample_bytes"] <= 300000 + 200_000
    bpt = report["bytes_per_token"]
    assert 1.5 < bpt["trained"] < bpt["bundled"]  # a 600-token vocabulary compresses less than the 8k one
    said = capsys.readouterr().out
    assert "bytes/token on held-out text: trained" in said and "warning: vocab" not in said  # 600 reached
    # the trained folder prepares and its ids are the tokenizer's
    data = prepare(DataArgs(tokenizer=str(out), max_documents=20, val_fraction=0.1), **Q)
    assert load_prepared_tokenizer(data).get_vocab() == tok.get_vocab()


def test_a_sample_too_small_for_the_vocab_size_says_so(tmp_path, capsys):
    """BPE stops when no pair is frequent enough: the smaller vocabulary is said in a warning line."""
    docs = tmp_path / "d.jsonl"
    docs.write_text("".join(json.dumps({"text": f"doc {i}: " + "the cat sat on the mat " * 20}) + "\n"
                            for i in range(300)))
    assert tokenizer_main(["train", "--dataset", str(docs), "--out", str(tmp_path / "tok"), "--vocab_size", "4000",
                           "--held_out_documents", "5"]) == 0
    size = json.loads((tmp_path / "tok" / "yxanul_tokenizer_report.json").read_text())["vocab_size"]
    assert size < 4000 and f"warning: vocab {size:,} < vocab_size 4,000" in capsys.readouterr().out


def test_tokenizer_train_bad_flags_are_one_line():
    with pytest.raises(ConfigError, match="vocab_size"):
        tokenizer_main(["train", "--out", "x", "--vocab_size", "100"])
    with pytest.raises(ConfigError, match="out"):
        tokenizer_main(["train"])


@pytest.mark.parametrize("flag,value,least", [("sample_bytes", "1000", 1024), ("held_out_documents", "-1", 0),
                                              ("min_frequency", "0", 1)])
def test_a_value_out_of_range_names_its_own_flag_only(tmp_path, capsys, flag, value, least):
    """The three ranges were one message naming 'sample_bytes/held_out_documents/min_frequency' and all three values."""
    from yxanul.cli import main as cli

    assert cli(["tokenizer", "train", "--out", str(tmp_path / "tok"), f"--{flag}", value]) == 2
    err = capsys.readouterr().err
    assert err == f"error: config key '{flag}': expected an integer >= {least}, got {int(value)}\n", err


def test_tokenizer_train_reads_the_rendered_text_template(tmp_path):
    from transformers import AutoTokenizer

    docs = tmp_path / "qa.jsonl"
    docs.write_text("".join(json.dumps({"question": f"zebraquux number {i}?", "answer": f"yes {i}"}) + "\n"
                            for i in range(200)))
    out = tmp_path / "tok"
    assert tokenizer_main(["train", "--dataset", str(docs), "--out", str(out), "--vocab_size", "300",
                           "--text_template", "Question: {question} Answer: {answer}"]) == 0
    tok = AutoTokenizer.from_pretrained(out)
    # words of the columns and of the template itself were merged: the sample was the rendered documents
    assert len(tok.tokenize(" zebraquux")) == 1 and len(tok.tokenize("Question:")) <= 2
    with pytest.raises(ConfigError, match="text_template"):  # one line, at parse time
        tokenizer_main(["train", "--dataset", str(docs), "--out", str(out), "--text_template", "{}"])


def test_held_out_documents_0_holds_out_nothing_and_reports_nothing(tmp_path, capsys):
    docs = tmp_path / "d.jsonl"
    docs.write_text("".join(json.dumps({"text": f"doc {i}: the cat sat on the mat {i}"}) + "\n" for i in range(50)))
    out = tmp_path / "tok"
    assert tokenizer_main(["train", "--dataset", str(docs), "--out", str(out), "--vocab_size", "300",
                           "--held_out_documents", "0"]) == 0
    report = json.loads((out / "yxanul_tokenizer_report.json").read_text())
    assert report["sample_documents"] == 50 and report["held_out_documents"] == 0 and report["bytes_per_token"] == {}
    assert "bytes/token" not in capsys.readouterr().out
    again = ["train", "--dataset", str(docs), "--out", str(out), "--vocab_size", "280", "--held_out_documents", "0"]
    with pytest.raises(ConfigError, match=r"'out': expected a folder without a tokenizer \(it holds tokenizer.json; "
                                          r"--overwrite replaces it\)"):
        tokenizer_main(again)  # it was replaced without a word: a model's ids mean this one
    assert json.loads((out / "tokenizer.json").read_text())["model"]["vocab"].__len__() == 300
    assert tokenizer_main([*again, "--overwrite"]) == 0
    assert len(json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]) == 280


def test_a_small_corpus_holds_out_its_last_tenth_apart_from_the_sample(tmp_path):
    """All of a small corpus fits in the sample: its last tenth is held out instead, and not also trained on
    (else the bytes/token measured on it would flatter the tokenizer)."""
    from yxanul.data.tokenizer_train import TokenizerTrainCommand, sample_and_held_out

    docs = tmp_path / "d.jsonl"
    docs.write_text("".join(json.dumps({"text": f"doc {i}: the cat sat on the mat"}) + "\n" for i in range(30)))
    cmd = TokenizerTrainCommand(action="train", dataset=str(docs), out=str(tmp_path / "t"))
    sample, held = sample_and_held_out(cmd)
    assert len(held) == 3 and len(sample) == 27 and not set(held) & set(sample)
    assert held == [f"doc {i}: the cat sat on the mat" for i in (27, 28, 29)]


@pytest.mark.parametrize("where", ["file", "below_a_file", "proc"])
def test_an_out_that_cannot_be_a_folder_is_one_line_before_training(tmp_path, where):
    existing = tmp_path / "notes.txt"
    existing.write_text("keep")
    out = {"file": existing, "below_a_file": existing / "tok", "proc": "/proc/yxanul-tok"}[where]
    with pytest.raises(ConfigError, match=r"^config key 'out': expected a folder") as e:
        tokenizer_main(["train", "--out", str(out), "--vocab_size", "300", "--sample_bytes", "2000"])
    assert "\n" not in str(e.value) and existing.read_text() == "keep"


@pytest.mark.parametrize("name", ["/nonexistent", "./missing-tok", "runs/a/tok", "~/no-such-tok"])
def test_a_tokenizer_path_that_does_not_exist_says_no_such_folder(name):
    from yxanul.data.tokenizer_load import load_tokenizer

    with pytest.raises(DataError, match=rf"^tokenizer '{re.escape(name)}': no such folder"):
        load_tokenizer(name)


def test_a_tokenizer_folder_under_home_loads_as_tilde(tmp_path, monkeypatch):
    """`tokenizer: ~/tok` in a YAML (no shell expands it) is the folder, not a Hub id."""
    import shutil

    from yxanul.data.sources import BUNDLED_TOKENIZER
    from yxanul.data.tokenizer_load import load_tokenizer

    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(BUNDLED_TOKENIZER, tmp_path / "tok")
    name, tok = load_tokenizer("~/tok")
    assert name == str(tmp_path / "tok") and tok.eos_token_id is not None


@pytest.mark.parametrize("name", ["gpt2", "org/name"])
def test_a_hub_id_is_still_asked_of_the_hub(name):
    from yxanul.data.tokenizer_load import load_tokenizer

    with pytest.raises(DataError, match=rf"^tokenizer '{name}': could not be loaded .*; HF_HUB_OFFLINE is set and "
                                        r"it is not in the HF cache: 'gpt2-offline' needs no Hub$"):  # set in tests
        load_tokenizer(name)


@pytest.mark.parametrize("name", ["gpt2", "tok/typo"])
def test_a_hub_id_with_the_hub_unreachable_is_one_line_at_once(name, monkeypatch):
    """Not offline mode, but no route to the Hub (a cluster node): one TCP probe, then one line naming the
    tokenizer, instead of transformers' minute of retries and the network blamed last."""
    import time

    from huggingface_hub import constants

    from yxanul.data.tokenizer_load import load_tokenizer

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # discard port: refused at once
    t0 = time.monotonic()
    with pytest.raises(DataError, match=rf"^tokenizer '{name}': not a local folder, and the Hugging Face Hub is "
                                        r"unreachable from here \(127.0.0.1: Connection refused\)"):
        load_tokenizer(name)
    assert time.monotonic() - t0 < 10


def test_an_empty_tokenizer_folder_says_it_has_no_tokenizer_files(tmp_path):
    from yxanul.data.tokenizer_load import load_tokenizer

    (tmp_path / "tok").mkdir()
    with pytest.raises(DataError, match=r"tokenizer '.*tok': a folder without tokenizer files"):
        load_tokenizer(str(tmp_path / "tok"))


def _superbpe_shaped(tmp_path, vocab: int = 200_005):
    """A byte-level BPE with SuperBPE's vocabulary size (200K): the bundled 8k BPE with its tokens moved
    to the top ids and fillers below, so the ids in use are > 65,535 and need uint32 shards."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from yxanul.data.sources import BUNDLED_TOKENIZER

    data = json.loads((BUNDLED_TOKENIZER / "tokenizer.json").read_text())
    old = data["model"]["vocab"]
    shift = vocab - len(old)
    fill = {f"<filler_{i}>": i for i in range(shift)}
    data["model"]["vocab"] = fill | {t: i + shift for t, i in old.items()}
    for t in data["added_tokens"]:
        t["id"] += shift
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(data)), eos_token="<|endoftext|>")
    tok.save_pretrained(tmp_path / "superbpe-shaped")
    return tmp_path / "superbpe-shaped"


def test_a_200k_vocabulary_prepares_into_uint32_shards_the_loader_reads(tmp_path):
    path = _superbpe_shaped(tmp_path)
    out = prepare(DataArgs(tokenizer=str(path), max_documents=40, val_fraction=0.1, shard_size_tokens=4096), **Q)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["dtype"] == "uint32" and meta["vocab_size"] == 200_005 and meta["eos_token_id"] > 65_535
    shard = open_shard(out / meta["splits"]["train"]["shards"][0])
    assert shard.dtype == np.uint32 and int(shard.min()) > 65_535  # every id in use is above uint16
    x, y = next(iter(WindowLoader(out, "train", 64, 2, seed=0)))
    assert int(x.min()) > 65_535 and x.max() < 200_005
    from yxanul.data.tokenizer_load import load_tokenizer

    shift = 200_005 - 8192
    ids = np.asarray(shard[:300]).astype(np.int64)
    text = load_prepared_tokenizer(out).decode(ids.tolist())
    assert text == load_tokenizer(None)[1].decode((ids - shift).tolist()) and len(text) > 500  # same text, shifted ids


def test_ids_with_holes_size_the_dtype_and_vocab_size_by_the_largest_id(tmp_path):
    """4 tokens, the largest id 70,000: uint32 shards and vocab_size 70,001 (an embedding every id fits)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({"<eos>": 0, "<unk>": 1, "a": 2, "b": 70_000}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>", unk_token="<unk>")
    assert len(tok) == 4
    tok.save_pretrained(tmp_path / "holes")
    docs = tmp_path / "d.jsonl"
    docs.write_text("".join(json.dumps({"text": " ".join("ab"[(i + j) % 2] for j in range(40))}) + "\n"
                            for i in range(30)))
    out = prepare(DataArgs(dataset=str(docs), tokenizer=str(tmp_path / "holes"), val_fraction=0.1,
                           data_dir=str(tmp_path / "o")), **Q)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["dtype"] == "uint32" and meta["vocab_size"] == 70_001
    shard = open_shard(out / meta["splits"]["train"]["shards"][0])
    assert sorted(set(np.asarray(shard).tolist())) == [0, 2, 70_000]
    from yxanul.data.tokenizer_load import run_vocab_size  # find-batch and plan size the embedding train builds

    assert run_vocab_size({"tokenizer": str(tmp_path / "holes")}) == meta["vocab_size"]


def test_bench_data_measures_raw_and_pipeline_on_the_same_documents(tmp_path, capsys):
    from yxanul.data.bench_data import main as bench_main

    src = tmp_path / "d.jsonl"
    src.write_text("\n".join(json.dumps({"text": f"Document {i}: " + "words and more words " * (i % 40 + 5)})
                             for i in range(300)))
    out = tmp_path / "r.json"
    assert bench_main(["--dataset", str(src), "--num_procs", "1", "2", "--trials", "1", "--output", str(out)]) == 0
    r = json.loads(out.read_text())
    names = [row["what"] for row in r["rows"]]
    assert "raw tokenizers encode_batch (all threads)" in names and r["documents"] == 300
    assert {"pipeline: packing phase, 1 process(es)", "pipeline: packing phase, 2 process(es)"} <= set(names)
    assert r["pipeline_over_raw"] > 0 and r["scaling_1_to_2"] > 0 and all(row["tokens_per_s"] > 0 for row in r["rows"])
    assert "| raw tokenizers encode_batch (all threads) |" in capsys.readouterr().out


def test_bench_data_reads_a_null_text_as_an_empty_row_as_prepare_does(tmp_path):
    from yxanul.data.bench_data import main as bench_main

    src = tmp_path / "d.jsonl"
    rows = [{"text": f"Document {i}: words and more words"} for i in range(40)] + [{"text": None}]
    src.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "r.json"
    assert bench_main(["--dataset", str(src), "--num_procs", "1", "--trials", "1", "--output", str(out)]) == 0
    assert json.loads(out.read_text())["documents"] == 41  # the pipeline wrote the raw tokenizer's tokens


@pytest.mark.parametrize("flag", ["--trials", "--repeat"])
def test_bench_data_needs_one_run_at_least(flag, capsys):
    from yxanul.cli import main as cli

    assert cli(["bench-data", flag, "0"]) == 2  # one line, exit 2: no measurement of nothing
    assert "config key 'repeat/trials': expected integers >= 1" in capsys.readouterr().err


def test_bench_data_refuses_what_prepare_refuses_in_one_line_before_measuring(tmp_path, capsys):
    """No text, a non-text value, a broken line (named by its number) and an --output that cannot be written: one
    line each, exit 2, before any measurement (not an internal error after it)."""
    from yxanul.cli import main as cli

    cases = {"empty.jsonl": ("", "contains no text"), "ws.jsonl": ("  \n\t\n", "contains no text"),
             "num.jsonl": ('{"text": "a b c"}\n{"text": 12345}\n', "column 'text' holds int values (e.g. '12345')"),
             "broken.jsonl": ('{"text": "a"}\n{"text": "b"}\n{"text": "c\n', "line 3: not JSON")}
    for name, (content, needle) in cases.items():
        (tmp_path / name).write_text(content)
        assert cli(["bench-data", "--dataset", str(tmp_path / name), "--trials", "1"]) == 2, name
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert cli(["bench-data", "--output", str(tmp_path / "no" / "r.json")]) == 2
    err = capsys.readouterr().err
    assert f"config key 'output': expected a file in an existing, writable folder ('{tmp_path / 'no'}')" in err
