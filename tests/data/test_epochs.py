"""Issue 21: a mixture source read max_epochs times, on_source_end stop | drop, resume after kill -9 with
epochs, and the loader's warning when max_steps needs more tokens than were prepared."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from _data import files_of, meta_of, split_docs, write_docs

from yxanul.data.args import DataArgs
from yxanul.data.loader import repeats_warning
from yxanul.data.prepare import prepare
from yxanul.errors import ConfigError, DataError

Q = {"progress": False, "say": lambda *a, **k: None}


def _passes(docs: list[str], n: int) -> list[list[str]]:
    k = len(docs) // n
    assert k * n == len(docs)
    return [docs[j * k:(j + 1) * k] for j in range(n)]


@pytest.mark.parametrize("streaming", [False, True])
def test_max_epochs_rereads_exactly_n_times_in_a_new_deterministic_order(tmp_path, streaming):
    src = write_docs(tmp_path / "a.jsonl", 120, 6, "doc")
    entry = {"path": str(src), "max_epochs": 3}
    kw = dict(datasets=[entry], val_fraction=0.1, streaming=streaming, shuffle_buffer=40 if streaming else 0,
              data_seed=7)
    lines = []
    out = prepare(DataArgs(**kw, data_dir=str(tmp_path / "o")), progress=False, say=lines.append)
    train, val = split_docs(out, "train"), split_docs(out, "val")
    assert not set(train) & set(val) and val  # every copy of a document lands in the same split
    originals = [json.loads(line)["text"] for line in src.read_text().splitlines()]
    for docs in (train, val):
        passes = _passes(docs, 3)
        assert all(sorted(p) == sorted(passes[0]) for p in passes) and len(set(passes[0])) == len(passes[0])
        assert passes[1] != passes[0] and passes[2] != passes[1] and passes[2] != passes[0]  # reshuffled
    assert sorted(set(train) | set(val)) == sorted(originals)
    if not streaming:  # the first pass keeps the source's order (unchanged for max_epochs: 1)
        assert _passes(train, 3)[0] == [d for d in originals if d in set(train)]
    rep = json.loads((out / "meta.json").read_text())["mixture"][str(src)]
    assert rep["epochs"] == rep["epochs_completed"] == 3 and rep["documents"] == 360
    assert any("epochs 3 (3 read to the end)" in line for line in lines)
    again = prepare(DataArgs(**kw, data_dir=str(tmp_path / "o2")), **Q)
    assert files_of(again) == files_of(out)  # deterministic: data_seed and the epoch


def test_a_reread_sources_order_settings_are_in_the_fingerprint(tmp_path):
    from yxanul.data.prepare import target_dir

    src = write_docs(tmp_path / "a.jsonl", 20, 6, "doc")
    fps = {target_dir(DataArgs(datasets=[{"path": str(src), "max_epochs": epochs}], streaming=streaming,
                               data_seed=seed))[2]
           for epochs in (2,) for streaming in (False, True) for seed in (0, 1)}
    assert len(fps) == 4  # streamed: the file's order each epoch; else a permutation seeded by data_seed
    once = {target_dir(DataArgs(dataset=str(src), streaming=streaming, data_seed=seed))[2]
            for streaming in (False, True) for seed in (0, 1)}
    assert len(once) == 1  # read once, without a shuffle buffer: the same bytes either way (one cache)
    # every setting that changes the prepared bytes names another cache (the shard size: another window grid)
    base = DataArgs(dataset=str(src))
    for key, value in (("shard_size_tokens", 4096), ("val_fraction", 0.2), ("max_documents", 10),
                       ("max_tokens", 5000)):
        assert target_dir(dataclasses.replace(base, **{key: value}))[2] != target_dir(base)[2], key


def test_no_document_of_a_reread_source_is_forced_into_validation_beside_its_copy(tmp_path):
    src = write_docs(tmp_path / "a.jsonl", 40, 6, "doc")
    with pytest.raises(DataError, match=r"no document of 80 was held out for validation \(val_fraction 0.001"):
        prepare(DataArgs(datasets=[{"path": str(src), "max_epochs": 2}], val_fraction=0.001,
                         data_dir=str(tmp_path / "o")), **Q)
    out = prepare(DataArgs(dataset=str(src), val_fraction=0.001, data_dir=str(tmp_path / "o1")), **Q)
    assert len(split_docs(out, "val")) == 1  # read once: the last document may still be held out


def _shares_after(meta: dict, gone: str, names: list[str]) -> list[float]:
    """Token shares of ``names`` in the train shards without any token of ``gone`` (after it dropped)."""
    shards = [m["sources"] for m in meta["splits"]["train"]["manifest"] if gone not in m["sources"]]
    tot = [sum(s.get(n, 0) for s in shards) for n in names]
    return [t / sum(tot) for t in tot]


def test_drop_renormalises_the_other_sources_and_stop_ends_the_mixture(tmp_path):
    a = write_docs(tmp_path / "a.jsonl", 3000, 20, "a")
    b = write_docs(tmp_path / "b.jsonl", 3000, 40, "b", seed=1)
    qa = write_docs(tmp_path / "qa.jsonl", 60, 20, "qa", seed=2)
    mix = [{"path": str(a), "weight": 0.5}, {"path": str(b), "weight": 0.3},
           {"path": str(qa), "weight": 0.2, "max_epochs": 2}]
    kw = dict(datasets=mix, max_tokens=120_000, shard_size_tokens=4096, val_fraction=0.01)
    lines = []
    out = prepare(DataArgs(**kw, on_source_end="drop", data_dir=str(tmp_path / "drop")), progress=False,
                  say=lines.append)
    meta = json.loads((out / "meta.json").read_text())
    rep = meta["mixture"]
    q = rep[str(qa)]
    assert q["epochs_completed"] == 2 and q["documents"] == 120 and "dropped_at_tokens" in q
    assert q["dropped_at_tokens"] < 120_000 * 0.5 and q["token_share"] < 0.1  # it left early
    total = meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"]
    assert 120_000 <= total < 120_000 + 400  # the others went on to max_tokens
    after = _shares_after(meta, str(qa), [str(a), str(b)])
    assert len([m for m in meta["splits"]["train"]["manifest"] if str(qa) not in m["sources"]]) >= 10
    assert abs(after[0] - 0.5 / 0.8) < 0.01 and abs(after[1] - 0.3 / 0.8) < 0.01, after
    assert any(f"'{qa}' left the mixture at {q['dropped_at_tokens']:,} tokens" in line for line in lines)
    stop = prepare(DataArgs(**kw, data_dir=str(tmp_path / "stop")), **Q)  # the default: the first end ends it
    rs = json.loads((stop / "meta.json").read_text())["mixture"]
    assert rs[str(qa)]["epochs_completed"] == 2 and "dropped_at_tokens" not in rs[str(qa)]
    assert sum(r["tokens"] for r in rs.values()) == q["dropped_at_tokens"]  # where drop went on
    assert all(abs(r["token_share"] - r["weight"]) < 0.01 for r in rs.values())


def test_drop_at_a_sources_max_tokens(tmp_path):
    a, b = write_docs(tmp_path / "a.jsonl", 500, 20, "a"), write_docs(tmp_path / "b.jsonl", 500, 20, "b", seed=1)
    out = prepare(DataArgs(datasets=[{"path": str(a)}, {"path": str(b), "max_tokens": 3000}], on_source_end="drop",
                           max_tokens=12_000, val_fraction=0.05), **Q)
    meta = json.loads((out / "meta.json").read_text())
    rb = meta["mixture"][str(b)]
    assert 3000 <= rb["tokens"] < 3100 and rb["dropped_because"] == "reached its max_tokens 3,000"
    assert 6000 <= rb["dropped_at_tokens"] < 6200 and rb["epochs_completed"] == 0  # left before its end
    assert 12_000 <= meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"] < 12_100


def test_stop_at_a_sources_max_tokens_says_which_source_ended_the_mixture(tmp_path):
    """A source at its own max_tokens ends a `stop` mixture as running out does; the closing line said nothing."""
    a, b = write_docs(tmp_path / "a.jsonl", 500, 20, "a"), write_docs(tmp_path / "b.jsonl", 500, 20, "b", seed=1)
    lines = []
    out = prepare(DataArgs(datasets=[{"path": str(a)}, {"path": str(b), "max_tokens": 3000}], val_fraction=0.05,
                           data_dir=str(tmp_path / "o")), progress=False, say=lines.append)
    assert 3000 <= json.loads((out / "meta.json").read_text())["mixture"][str(b)]["tokens"] < 3100
    ended = [x for x in lines if "the mixture ended when" in x]
    assert len(ended) == 1 and ended[0].startswith(f"data: the mixture ended when '{b}' reached its max_tokens 3,000 "
                                                   "(on_source_end: stop"), lines


def test_interrupted_after_a_drop_resumes_byte_identical(tmp_path, monkeypatch):
    """The checkpoint keeps who dropped (and when): stopped well after the QA set left, the resumed run
    does not read it again and ends with the same bytes as an uninterrupted one."""
    from yxanul.data import mixture

    a, qa = write_docs(tmp_path / "a.jsonl", 1500, 20, "a"), write_docs(tmp_path / "qa.jsonl", 40, 20, "qa", seed=2)
    kw = dict(datasets=[{"path": str(a), "weight": 0.8}, {"path": str(qa), "weight": 0.2, "max_epochs": 3}],
              on_source_end="drop", max_tokens=60_000, shard_size_tokens=2048, val_fraction=0.02, prepare_num_proc=1)
    ref = prepare(DataArgs(**kw, data_dir=str(tmp_path / "ref")), **Q)
    real = mixture.Mixture.took

    def interrupted(self, i, n):
        if self.dropped[1] and sum(self.tokens) > self.dropped[1][0] + 10_000:
            raise KeyboardInterrupt
        return real(self, i, n)
    args = DataArgs(**kw, data_dir=str(tmp_path / "out"))
    with monkeypatch.context() as m:
        m.setattr(mixture.Mixture, "took", interrupted)
        with pytest.raises(KeyboardInterrupt):
            prepare(args, **Q)
    state = json.loads((tmp_path / "out.partial" / "progress.json").read_text())["mix"]
    assert state["dropped"][1] and state["epoch"][1] == 2 and state["ended"][1]
    lines = []
    prepare(args, progress=False, say=lines.append)
    assert any("resuming" in line for line in lines)
    assert files_of(tmp_path / "out") == files_of(ref) and meta_of(tmp_path / "out") == meta_of(ref)


def test_bad_max_epochs_and_on_source_end_are_one_line(tmp_path):
    for bad in (0, 1.5, True, "2"):
        with pytest.raises(ConfigError, match="max_epochs of 'x.jsonl'"):
            DataArgs(datasets=[{"path": "x.jsonl", "max_epochs": bad}])
    with pytest.raises(ConfigError, match="on_source_end"):
        DataArgs(on_source_end="loop")
    r = subprocess.run([sys.executable, "-m", "yxanul", "prepare", "--on_source_end", "loop"], capture_output=True,
                       text=True, env=os.environ)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "on_source_end" in r.stderr


@pytest.mark.parametrize("epoch", [0, 1])
def test_a_state_after_an_epochs_last_document_resumes_at_its_end(tmp_path, epoch):
    """A checkpoint can fall after a source's last document of an epoch, before its end was seen."""
    import numpy as np

    from yxanul.data.mixture import SourceStream
    from yxanul.data.prepare import _encoder
    from yxanul.data.sources import resolve_source
    from yxanul.data.tokenize import Pool
    from yxanul.data.tokenizer_load import load_tokenizer

    src = resolve_source(str(write_docs(tmp_path / "a.jsonl", 30, 5, "a")))
    args = DataArgs(prepare_num_proc=1)
    pool = Pool(_encoder(args, load_tokenizer(None)[1], np.uint16), 1)
    try:
        def stream(skip):
            return SourceStream(0, src, pool, False, skip, 0, 0, tmp_path / "arrow", epoch=epoch)
        assert stream(30).next_doc() is None
        last = stream(29)
        assert last.next_doc() is not None and last.next_doc() is None
    finally:
        pool.close()


def _config_cmd(cfg: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "yxanul", "prepare", "--config", str(cfg), "--data_dir", str(out)]


@pytest.mark.slow
def test_kill_9_during_a_later_epoch_resumes_byte_identical(tmp_path):
    a = write_docs(tmp_path / "a.jsonl", 1500, 40, "a")
    qa = write_docs(tmp_path / "qa.jsonl", 100, 30, "qa", seed=2)
    cfg = tmp_path / "mix.yaml"
    cfg.write_text(yaml.safe_dump({
        "datasets": [{"path": str(a), "weight": 0.7}, {"path": str(qa), "weight": 0.3, "max_epochs": 4}],
        "on_source_end": "drop", "max_tokens": 150_000, "shard_size_tokens": 2048, "val_fraction": 0.02,
        "prepare_num_proc": 1, "streaming": True, "shuffle_buffer": 50}))
    ref = tmp_path / "ref"
    subprocess.run(_config_cmd(cfg, ref), check=True, capture_output=True, env=os.environ)
    assert json.loads((ref / "meta.json").read_text())["mixture"][str(qa)]["epochs_completed"] == 4
    out, work = tmp_path / "out", tmp_path / "out.partial"
    p = subprocess.Popen(_config_cmd(cfg, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, epoch = time.time() + 120, 0
    while epoch < 2 and p.poll() is None and time.time() < deadline:  # kill it in the QA source's 3rd epoch
        try:
            epoch = json.loads((work / "progress.json").read_text())["mix"]["epoch"][1]
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert epoch >= 2 and not (out / "meta.json").exists(), "the run ended before a checkpoint in a later epoch"
    r = subprocess.run(_config_cmd(cfg, out), check=True, capture_output=True, text=True, env=os.environ)
    assert "resuming" in r.stdout
    assert files_of(out) == files_of(ref) and meta_of(out) == meta_of(ref)


def test_loader_warns_when_max_steps_needs_more_tokens_than_prepared(bundled):
    train = json.loads((Path(bundled) / "meta.json").read_text())["splits"]["train"]["tokens"]
    assert repeats_warning(bundled, 10, train // 10) is None  # one pass is enough: silent
    assert repeats_warning(bundled, 1, train) is None and repeats_warning(bundled, 1, train + 1) is not None
    msg = repeats_warning(bundled, 83_923, 131_072)
    need = 83_923 * 131_072
    assert msg == (f"warning: max_steps 83,923 reads the prepared data {need / train:,.1f} times ({train:,} tokens "
                   f"prepared, {need:,} needed): prepare more data or lower max_steps")
    assert repeats_warning(bundled, 11, train // 10) is not None and "\n" not in msg
