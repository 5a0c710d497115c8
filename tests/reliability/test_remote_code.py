"""A tokenizer that ships its own Python code (auto_map) is refused in one line, never with a prompt (no
stdin here), and its code does not run; with --trust_remote_code it runs (the user's choice) and the
prepared folder still keeps no code."""

import json
import shutil

import pytest
from _reliability import ok, one_line, yx_here

from yxanul.data.sources import BUNDLED_TOKENIZER

EVIL = """
import pathlib
pathlib.Path({marker!r}).write_text("the tokenizer's own code ran")
from transformers import PreTrainedTokenizerFast


class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""


@pytest.fixture
def coded_tokenizer(tmp_path):
    tok = tmp_path / "tok"
    shutil.copytree(BUNDLED_TOKENIZER, tok)
    cfg = json.loads((tok / "tokenizer_config.json").read_text())
    cfg |= {"auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]}, "tokenizer_class": "EvilTokenizer"}
    (tok / "tokenizer_config.json").write_text(json.dumps(cfg))
    marker = tmp_path / "RAN"
    (tok / "evil.py").write_text(EVIL.format(marker=str(marker)))
    return tok, marker


def _prepare(tok, out, *more):
    return yx_here("prepare", "--tokenizer", tok, "--data_dir", out, "--max_documents", "20", "--val_fraction",
                   "0.2", "--prepare_num_proc", "1", *more)


def test_a_tokenizer_with_its_own_code_is_refused_in_one_line(coded_tokenizer, tmp_path):
    tok, marker = coded_tokenizer
    r = _prepare(tok, tmp_path / "d")
    one_line(r, 2, f"tokenizer '{tok}': {tok / 'tokenizer_config.json'} declares auto_map")
    assert "--trust_remote_code" in r.stderr and not marker.exists() and not (tmp_path / "d").exists()


def test_trusted_code_runs_but_the_prepared_folder_keeps_none(coded_tokenizer, tmp_path):
    tok, marker = coded_tokenizer
    out = tmp_path / "d"
    ok(_prepare(tok, out, "--trust_remote_code"))
    assert marker.exists()  # asked for
    saved = out / "tokenizer"
    assert not list(saved.glob("*.py")) and "auto_map" not in (saved / "tokenizer_config.json").read_text()
    marker.unlink()
    from yxanul.data.tokenizer_load import load_prepared_tokenizer

    assert load_prepared_tokenizer(out).decode([100, 200]) and not marker.exists()
