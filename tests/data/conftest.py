"""Shared data-test fixtures: a private cache, small document files, the bundled corpus prepared once."""

import json

import pytest

from yxanul.data.args import DataArgs
from yxanul.data.prepare import prepare


def quiet(*_a, **_k):
    pass


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("YXANUL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets  # read at its import, so patched here: nothing may land in ~/.cache/huggingface

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets")


@pytest.fixture
def docs_file(tmp_path):
    """make(n) -> (path of a .jsonl with n documents, the documents)."""
    def make(n=60, name="docs.jsonl"):
        p = tmp_path / name
        docs = [f"Document {i}: " + " ".join(f"word{j % 17}" for j in range(i % 23 + 5)) for i in range(n)]
        p.write_text("\n".join(json.dumps({"text": d, "id": i}) for i, d in enumerate(docs)))
        return p, docs
    return make


@pytest.fixture(scope="session")
def bundled(tmp_path_factory):
    """The bundled corpus, prepared with the bundled tokenizer (what a default run trains on)."""
    return prepare(DataArgs(data_dir=str(tmp_path_factory.mktemp("bundled") / "d")), progress=False, say=quiet)
