"""Integration-test fixtures: a small prepared slice of the bundled corpus (session-wide), offline caches."""

import json

import pytest


@pytest.fixture(scope="session")
def small_data(tmp_path_factory):
    """(data_dir, vocab_size): the first 150 documents of the bundled corpus, bundled tokenizer."""
    from yxanul.data.args import DataArgs
    from yxanul.data.prepare import prepare

    d = prepare(DataArgs(data_dir=str(tmp_path_factory.mktemp("data") / "d"), max_documents=150, val_fraction=0.05),
                progress=False, say=lambda *a, **k: None)
    return d, json.loads((d / "meta.json").read_text())["vocab_size"]


@pytest.fixture(autouse=True)
def _offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    import datasets  # read at its import, so patched here: nothing may land in ~/.cache/huggingface

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets")
