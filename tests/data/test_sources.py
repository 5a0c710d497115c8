"""Sources: a `datasets` save_to_disk folder is read as the dataset it holds, not as a folder of files."""

import datasets
import pytest
from _data import files_of, split_docs

from yxanul.data.args import DataArgs
from yxanul.data.prepare import prepare
from yxanul.errors import DataError

Q = {"progress": False, "say": lambda *a, **k: None}


@pytest.mark.parametrize("streaming", [False, True])
def test_a_saved_dataset_prepares_as_the_same_rows_in_a_jsonl_do(tmp_path, docs_file, streaming):
    src, docs = docs_file(60)
    saved = tmp_path / "saved"
    datasets.Dataset.from_json(str(src), cache_dir=str(tmp_path / "hf")).save_to_disk(str(saved))
    out = prepare(DataArgs(dataset=str(saved), data_dir=str(tmp_path / "a"), streaming=streaming), **Q)
    ref = prepare(DataArgs(dataset=str(src), data_dir=str(tmp_path / "b")), **Q)
    assert files_of(out) == files_of(ref) and split_docs(out, "train") == split_docs(ref, "train")


def test_a_saved_dataset_dict_reads_dataset_split(tmp_path, docs_file):
    _, docs = docs_file(60)
    saved = tmp_path / "dict"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["no"] * 10}),
                          "test": datasets.Dataset.from_dict({"body": docs})}).save_to_disk(str(saved))
    out = prepare(DataArgs(dataset=str(saved), dataset_split="test", text_column="body",
                           data_dir=str(tmp_path / "o")), **Q)
    assert sorted(split_docs(out, "train") + split_docs(out, "val")) == sorted(docs)
    with pytest.raises(DataError, match=r"dict': no split 'validation' \(splits: train, test\); set dataset_split"):
        prepare(DataArgs(dataset=str(saved), dataset_split="validation", data_dir=str(tmp_path / "p")), **Q)


def test_each_split_of_a_saved_dataset_dict_has_its_own_cache(tmp_path, docs_file, monkeypatch):
    """Prepared into the cache (no data_dir), the train and test splits of one folder are two folders: the
    fingerprint names the split, or the second prepare would reuse the first one's shards."""
    _, docs = docs_file(60)
    monkeypatch.setenv("YXANUL_CACHE", str(tmp_path / "cache"))
    saved = tmp_path / "dict"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": docs}),
                          "test": datasets.Dataset.from_dict({"text": docs[:20]})}).save_to_disk(str(saved))
    train, test = (prepare(DataArgs(dataset=str(saved), dataset_split=s), **Q) for s in ("train", "test"))
    assert train != test
    assert sorted(split_docs(test, "train") + split_docs(test, "val")) == sorted(docs[:20])
