"""Sources: a `datasets` save_to_disk folder is read as the dataset it holds, not as a folder of files; what a
source holds that is not text, a split a local file does not have and a path listed twice are one line."""

import json
import re
from pathlib import Path

import datasets
import pytest
from _data import files_of, split_docs

from yxanul.data.args import DataArgs
from yxanul.data.prepare import prepare
from yxanul.data.sources import resolve_source
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


def test_a_split_of_a_saved_dataset_without_splits_is_one_line_not_the_whole_dataset(tmp_path, docs_file):
    _, docs = docs_file(40)
    saved = tmp_path / "std"
    datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(saved))
    with pytest.raises(DataError, match=rf"^dataset '{saved}': a save_to_disk Dataset has no splits \(split 'test'"):
        prepare(DataArgs(dataset=str(saved), dataset_split="test", data_dir=str(tmp_path / "o")), **Q)
    with pytest.raises(DataError, match=r"Dataset has no splits \(split 'validation'"):
        prepare(DataArgs(datasets=[{"path": str(saved), "split": "validation"}], data_dir=str(tmp_path / "p")), **Q)


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


def test_a_text_column_holding_other_values_than_text_is_one_line_not_rows_dropped(tmp_path):
    """A null is an empty row (skipped, as documented); a number, list or dict in the text column is one line
    naming the column and the type: dropping those rows silently would train on less than the user's data."""
    for value, kind in ((12345, "int"), (["a", "b"], "list"), ({"a": 1}, "dict"), (True, "bool")):
        p = tmp_path / f"{kind}.jsonl"
        rows = [{"text": f"document {i} with words"} for i in range(30)] + [{"text": None}, {"text": value}]
        p.write_text("\n".join(json.dumps(r) for r in rows))
        with pytest.raises(DataError, match=rf"dataset '{p}': column 'text' holds {kind} values"):
            prepare(DataArgs(dataset=str(p), data_dir=str(tmp_path / f"d-{kind}")), **Q)
    p = tmp_path / "nulls.jsonl"
    p.write_text("\n".join(json.dumps({"text": None if i % 5 == 0 else f"doc {i} words"}) for i in range(40)))
    out = prepare(DataArgs(dataset=str(p), data_dir=str(tmp_path / "d-nulls")), **Q)
    assert len(split_docs(out, "train")) + len(split_docs(out, "val")) == 32


def test_a_split_of_a_local_file_is_one_line_not_the_whole_file(tmp_path, docs_file):
    path, _ = docs_file()
    with pytest.raises(DataError, match=rf"dataset '{path}': local files have one split, 'train' \(split "
                                        r"'validation' selects"):
        prepare(DataArgs(dataset=str(path), dataset_split="validation", data_dir=str(tmp_path / "d")), **Q)


def test_a_path_twice_in_a_mixture_is_told_apart_or_refused(tmp_path):
    """Twice with the same settings: one line (its documents would be read twice and the report merge them);
    with other columns (or Hub configs/splits): each entry named by what tells it apart, in the report too."""
    p = tmp_path / "two.jsonl"
    p.write_text("\n".join(json.dumps({"text": f"alpha {i} " * 8, "q": f"question {i} " * 4}) for i in range(200)))
    same = [{"path": str(p), "weight": 0.5}, {"path": str(p), "weight": 0.5}]
    with pytest.raises(DataError, match=f"dataset '{p}': listed 2 times in datasets with the same settings"):
        prepare(DataArgs(datasets=same, data_dir=str(tmp_path / "d1")), **Q)
    out = prepare(DataArgs(datasets=[same[0], {**same[1], "text_column": "q"}], data_dir=str(tmp_path / "d2")), **Q)
    mix = json.loads((out / "meta.json").read_text())["mixture"]
    assert set(mix) == {f"{p} (text_column=text)", f"{p} (text_column=q)"}
    assert all(m["documents"] > 0 for m in mix.values())


def test_a_csv_without_a_header_row_is_one_line_asking_about_it(tmp_path):
    """Its first document became the column name: one line, the name cut, the likely cause named."""
    p = tmp_path / "noheader.csv"
    p.write_text('"First document,\nover two lines and long enough to be cut at forty characters"\n"second"\n"third"\n')
    with pytest.raises(DataError) as e:
        prepare(DataArgs(dataset=str(p), data_dir=str(tmp_path / "d")), **Q)
    assert "\n" not in str(e.value) and "(is its first row a header?); set text_column" in str(e.value)
    assert "columns: First document, over two lines and long )" in str(e.value)


def test_a_broken_line_in_the_middle_of_a_jsonl_is_named_by_its_number(tmp_path):
    p = tmp_path / "broken.jsonl"
    rows = [json.dumps({"text": f"document {i} words"}) for i in range(100)]
    rows[50] = '{"text": "unterminated'
    p.write_text("\n".join(rows))
    with pytest.raises(DataError, match=rf"dataset '{p}': could not be loaded \({p} line 51: not JSON"):
        prepare(DataArgs(dataset=str(p), data_dir=str(tmp_path / "d")), **Q)


def test_one_file_reached_by_two_entries_of_a_mixture_is_one_line_naming_both(tmp_path, monkeypatch):
    """Spelt differently (relative and absolute, a folder or glob holding it, a symlink), one file read twice
    with the same settings would put copies of its validation documents into training: refused before reading.
    With another text_column it is two readings of the file, as for a repeated path."""
    (tmp_path / "d").mkdir()
    p = tmp_path / "d" / "a.jsonl"
    p.write_text("\n".join(json.dumps({"text": f"alpha {i} " * 8, "q": f"q {i} " * 4}) for i in range(100)))
    (tmp_path / "link.jsonl").symlink_to(p)
    monkeypatch.chdir(tmp_path)
    for other in ("d/a.jsonl", str(tmp_path / "d"), "d/*.jsonl", "link.jsonl"):
        entries = [{"path": other, "weight": 0.5}, {"path": str(p), "weight": 0.5}]
        want = rf"^datasets: entries '{re.escape(other)}' and '{p}' both read '{p}' with the same settings \(its"
        with pytest.raises(DataError, match=want + " documents would be read twice"):
            prepare(DataArgs(datasets=entries, data_dir=str(tmp_path / "o")), **Q)
    out = prepare(DataArgs(datasets=[{"path": "d/a.jsonl"}, {"path": str(p), "text_column": "q"}],
                           data_dir=str(tmp_path / "o2")), **Q)
    assert all(m["documents"] > 0 for m in json.loads((out / "meta.json").read_text())["mixture"].values())


@pytest.mark.parametrize("streaming", [False, True])
def test_a_byte_order_mark_is_not_part_of_a_text_or_csv_document(tmp_path, streaming):
    """Windows editors start UTF-8 files with a BOM: .txt (gz too) and .csv documents start without it, as .jsonl
    ones do; a file holding only a BOM has no text."""
    import gzip

    (tmp_path / "t").mkdir()
    docs = [f"Document {i} from a Windows editor with words enough." for i in range(12)]
    for i, d in enumerate(docs[:-1]):
        (tmp_path / "t" / f"{i:02}.txt").write_bytes(b"\xef\xbb\xbf" + d.encode())
    (tmp_path / "t" / "99.txt.gz").write_bytes(gzip.compress(b"\xef\xbb\xbf" + docs[-1].encode()))
    (tmp_path / "a.csv").write_bytes(b"\xef\xbb\xbftext\n" + "\n".join(docs).encode())
    for src in ("t", "a.csv"):
        out = prepare(DataArgs(dataset=str(tmp_path / src), streaming=streaming, data_dir=str(tmp_path / f"o{src}")),
                      **Q)
        assert sorted(split_docs(out, "train") + split_docs(out, "val")) == sorted(docs)
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbf\n")
    with pytest.raises(DataError, match="bom.txt': contains no text"):
        prepare(DataArgs(dataset=str(tmp_path / "bom.txt"), data_dir=str(tmp_path / "o")), **Q)


def test_a_config_name_for_local_data_is_one_line_not_ignored(tmp_path, docs_file):
    """dataset_name (an entry's name) selects a Hub dataset's config; local files and save_to_disk folders have
    none, so it was a silent no-op."""
    path, docs = docs_file(20)
    saved = tmp_path / "std"
    datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(saved))
    for where in (path, saved):
        with pytest.raises(DataError, match=rf"^dataset '{where}': config name 'foo' selects a config of a Hub"):
            prepare(DataArgs(dataset=str(where), dataset_name="foo", data_dir=str(tmp_path / "o")), **Q)
    with pytest.raises(DataError, match=r"config name 'bar' .* leave dataset_name \(a datasets entry's name\) unset"):
        prepare(DataArgs(datasets=[{"path": str(path), "name": "bar"}], data_dir=str(tmp_path / "o")), **Q)
    assert not (tmp_path / "o").exists()


def test_a_hub_repository_folder_reads_its_data_not_its_readme(tmp_path, docs_file):
    """`hf download` puts README.md (and .gitattributes, a LICENSE) beside the data: that folder was refused as
    files of two kinds. They are skipped where the data is of another kind; a folder of .md documents keeps its
    README; two kinds of data are still one line, which says how to read one."""
    path, docs = docs_file(40)
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    path.rename(repo / "data" / "train.jsonl")
    for name in ("README.md", "LICENSE.md", ".gitattributes"):
        (repo / name).write_text("---\nlicense: mit\n---\n# A dataset card\n")
    out = prepare(DataArgs(dataset=str(repo), data_dir=str(tmp_path / "o")), **Q)
    assert sorted(split_docs(out, "train") + split_docs(out, "val")) == sorted(docs)
    notes = tmp_path / "notes"
    notes.mkdir()
    for i, d in enumerate(docs[:12]):
        (notes / f"{i:02}.md").write_text(d)
    (notes / "README.md").write_text("The notes, in order.")
    assert [Path(f).name for f in resolve_source(str(notes)).files][-1] == "README.md"
    (repo / "data" / "more.txt").write_text("a text file")
    with pytest.raises(DataError, match=r"got \['.jsonl', '.txt'\]; read one kind with a glob, e.g. '.*repo/\*\*/\*"
                                        r"\.jsonl'"):
        prepare(DataArgs(dataset=str(repo), data_dir=str(tmp_path / "o3")), **Q)


def test_an_empty_yxanul_cache_is_unset_not_the_current_folder(tmp_path, monkeypatch):
    """`YXANUL_CACHE= yxanul prepare ...` read Path(""): prepared data was written into the current folder."""
    from yxanul.data.prepare import target_dir
    from yxanul.training.batching.cache import user_cache_file

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("YXANUL_CACHE", "")
    monkeypatch.chdir(tmp_path)
    out = target_dir(DataArgs())[0]
    assert out.parent == home / ".cache" / "yxanul" / "data", out
    assert user_cache_file() == home / ".cache" / "yxanul" / "batch_cache.json"
