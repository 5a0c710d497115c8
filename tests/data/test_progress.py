"""`yxanul prepare`'s progress bar: its ETA (tqdm's (total - n) / rate) matches the time really left,
driven by a clock that advances with the tokens tokenized (a real prepare; only tqdm's clock is ours)."""

import json
import re

import numpy as np
import pytest
import tqdm.auto
import tqdm.std

from yxanul.data.args import DataArgs
from yxanul.data.prepare import prepare

RATE = 1000.0  # tokens per (fake) second


def _docs(path, n, words, seed):
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for i in range(n):
            body = " ".join(f"w{j}" for j in rng.integers(0, 300, int(words * rng.uniform(1, 3))))
            f.write(json.dumps({"text": f"doc {i}: {body}"}) + "\n")
    return str(path)


def _eta_seconds(text: str) -> int | None:
    m = re.search(r"<(?:(\d+):)?(\d+):(\d+)", text)
    return None if m is None else int(m[1] or 0) * 3600 + int(m[2]) * 60 + int(m[3])


@pytest.fixture
def bars(monkeypatch):
    """Every bar prepare opens, with (n, total, shown ETA) after each update; time = tokens / RATE."""
    seen = []

    class Clocked(tqdm.std.tqdm):
        def __init__(self, *a, **k):
            self.clock = 0.0
            super().__init__(*a, **k)
            self._time = lambda: self.clock
            self.start_t = self.last_print_t = 0.0
            self.log = []
            seen.append(self)

        def update(self, n=1):
            self.clock += n / RATE  # the document took this long to read and tokenize
            out = super().update(n)
            self.log.append((self.n, self.total, _eta_seconds(str(self))))
            return out

    monkeypatch.setattr(tqdm.auto, "tqdm", Clocked)
    return seen


def _check_eta(log, final_n):
    """From 10 % on, the shown ETA is the time really left within 5 % of the whole run (+1 s rounding)."""
    checked = 0
    for n, total, eta in log:
        if n < 0.1 * final_n:
            continue
        if eta is None and total is not None and n >= total:
            eta = 0  # past max_tokens by the last document: tqdm shows no ETA, none is left
        assert eta is not None, (n, total)
        true = (final_n - n) / RATE
        assert abs(eta - true) <= 0.05 * final_n / RATE + 1, (n, total, eta, true)
        checked += 1
    assert checked > 50


def test_eta_with_max_tokens(tmp_path, bars):
    a, b = _docs(tmp_path / "a.jsonl", 2000, 20, 0), _docs(tmp_path / "b.jsonl", 2000, 40, 1)
    out = prepare(DataArgs(datasets=[{"path": a, "weight": 1}, {"path": b, "weight": 1}], max_tokens=60_000,
                           prepare_num_proc=1, data_dir=str(tmp_path / "o")), progress=True, say=lambda *_: None)
    meta = json.loads((out / "meta.json").read_text())
    written = meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"]
    (bar,) = bars
    assert bar.total == 60_000 and bar.n == written  # the bar counts what is written, toward max_tokens
    _check_eta(bar.log, written)


def test_eta_estimated_from_the_documents_read(tmp_path, bars):
    """One local source, no max_tokens: the total is estimated from the share of documents read."""
    src = _docs(tmp_path / "a.jsonl", 3000, 20, 2)
    out = prepare(DataArgs(dataset=src, prepare_num_proc=1, data_dir=str(tmp_path / "o")), progress=True,
                  say=lambda *_: None)
    meta = json.loads((out / "meta.json").read_text())
    written = meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"]
    (bar,) = bars
    assert bar.n == written and abs(bar.total - written) <= written * 0.001 + 200
    _check_eta(bar.log, written)
