"""Text sources: local files/globs/directories and Hub datasets, read through `datasets`."""

from __future__ import annotations

import codecs
import glob
import gzip
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError, first_line, is_no_space
from .template import check_first_example, render_batch

ASSETS = Path(__file__).resolve().parents[1] / "assets"
BUNDLED_CORPUS = ASSETS / "corpus" / "shakespeare.jsonl.gz"
BUNDLED_TOKENIZER = ASSETS / "tokenizer"


def cache_root() -> Path:
    """Where prepared data, converted tokenizers and measured batch sizes are cached: ``YXANUL_CACHE``, else
    ~/.cache/yxanul. The one place that reads the variable; an empty one (``YXANUL_CACHE= yxanul prepare``) is
    unset, not ``Path("")``, the current folder."""
    return Path(os.environ.get("YXANUL_CACHE") or Path.home() / ".cache" / "yxanul")


_BUILDERS = {".txt": "text", ".md": "text", ".text": "text", ".jsonl": "json", ".json": "json",
             ".parquet": "parquet", ".csv": "csv"}


@dataclass
class Source:
    path: str                 # what the user wrote
    files: list[str] | None   # resolved local files (None: a Hub dataset)
    builder: str | None       # datasets builder for local files
    weight: float = 1.0
    split: str = "train"
    text_column: str = "text"
    name: str | None = None   # Hub config name
    max_tokens: int | None = None  # this source's cap in a mixture
    text_template: str | None = None  # the text built from several columns (template.py)
    max_epochs: int = 1       # times this source may be read in a mixture (mixture.py)
    label: str | None = None  # its name in reports and meta.json where its path is in a mixture twice

    @property
    def key(self) -> str:
        """The source's name in the mixture's report, meta.json and the shards' per-source counts."""
        return self.label or self.path

    def fingerprint(self) -> dict:
        cap = {} if self.max_tokens is None else {"max_tokens": self.max_tokens}
        cap |= {} if self.text_template is None else {"text_template": self.text_template}
        cap |= {} if self.max_epochs == 1 else {"max_epochs": self.max_epochs}
        cap |= {"split": self.split} if self.builder == SAVED else {}  # one folder holds a DatasetDict's splits
        if self.files is None:
            return {"hub": self.path, "name": self.name, "split": self.split, "column": self.text_column,
                    "weight": self.weight} | cap
        # absolute path, size and mtime in ns: a file rewritten within the same second is seen as changed
        return {"files": [(os.path.abspath(f), os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in self.files],
                "column": self.text_column, "weight": self.weight} | cap


def _suffix(path: str) -> str:
    return Path(path.removesuffix(".gz")).suffix.lower()


def _check_exists(path: str) -> None:
    """Missing or empty file: one clear line naming the file (cheap: done on every resolve)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"dataset '{path}': no such file")
    if p.stat().st_size == 0:
        raise DataError(f"dataset '{path}': empty file")


def _check_file(path: str) -> None:
    """Missing, empty or non-UTF-8 text: one clear line naming the file."""
    _check_exists(path)
    if _suffix(path) == ".parquet":
        return
    gz = path.endswith(".gz")
    dec = codecs.getincrementaldecoder("utf-8")()
    offset, limit, nonblank = 0, 256 << 20, False  # check the first 256 MB fully
    try:
        with (gzip.open if gz else open)(path, "rb") as f:
            while offset < limit:
                chunk = f.read(1 << 20)
                pending = len(dec.getstate()[0])  # bytes of a split character kept from the last chunk
                try:
                    text = dec.decode(chunk, final=not chunk)
                except UnicodeDecodeError as e:
                    where = f"offset {offset - pending + e.start}" + (" of the decompressed text" if gz else "")
                    raise DataError(f"dataset '{path}': not UTF-8 text (byte 0x{e.object[e.start]:02x} at {where}); "
                                    "convert it, e.g. iconv -f latin1 -t utf-8") from None
                if not chunk:
                    break
                nonblank = nonblank or bool(text.replace("\ufeff", "").strip())  # a BOM alone is no text
                offset += len(chunk)
    except (OSError, EOFError) as e:  # a corrupt .gz
        raise DataError(f"dataset '{path}': unreadable ({e})") from None
    if not nonblank:
        raise DataError(f"dataset '{path}': contains no text")


SAVED = "saved"  # the builder of a `datasets` save_to_disk folder: read with load_from_disk


def _saved_to_disk(p: Path) -> list[str] | None:
    """The files of a ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` folder (its Arrow data and the
    JSON that describes it: their sizes and mtimes fingerprint it), None for any other folder. Read as a
    folder of files, its metadata JSON would be taken for the documents."""
    if not ((p / "state.json").is_file() and (p / "dataset_info.json").is_file()) and \
            not (p / "dataset_dict.json").is_file():
        return None
    return sorted(str(f) for f in p.rglob("*") if f.is_file() and f.suffix in (".arrow", ".json"))


_REPO_FILES = ("readme", "license", "licence", "copying", "notice", "citation", "changelog", "dataset_infos")


def _folder_files(p: Path, path: str) -> list[str]:
    """A folder's data files, hidden ones aside. A Hub repository's own files (README.md, LICENSE, CITATION.cff
    beside parquet, as `hf download` writes them) are no data where the data is of another kind: skipped; a folder
    of .md documents keeps its README.md."""
    files = sorted(str(f) for f in p.rglob("*") if f.is_file() and _suffix(str(f)) in _BUILDERS
                   and not any(part.startswith(".") for part in f.relative_to(p).parts))
    if not files:
        raise DataError(f"dataset '{path}': a directory with no .txt/.md/.jsonl/.json/.parquet/.csv files")
    data = [f for f in files if not Path(f).name.lower().startswith(_REPO_FILES)]
    kinds = {_suffix(f) for f in data}
    return [f for f in files if f in data or _suffix(f) in kinds] if data else files


def _no_config_name(path: str, name: str | None) -> None:
    if name is not None:  # local data is read whole: the config name would be a silent no-op
        raise DataError(f"dataset '{path}': config name '{name}' selects a config of a Hub dataset, and this is a "
                        "local path; leave dataset_name (a datasets entry's name) unset")


def resolve_source(path: str, weight: float = 1.0, split: str = "train", text_column: str = "text",
                   name: str | None = None) -> Source:
    p = Path(path).expanduser()
    if p.is_dir() and (saved := _saved_to_disk(p)) is not None:
        _no_config_name(path, name)
        return Source(path, saved, SAVED, weight, split, text_column, name)
    if p.is_dir():
        files = _folder_files(p, path)
    elif any(c in path for c in "*?["):
        files = sorted(f for f in glob.glob(os.path.expanduser(path), recursive=True) if os.path.isfile(f))
        if not files:
            raise DataError(f"dataset '{path}': no such file (the pattern matches nothing)")
    elif p.exists() or path.startswith((".", "/", "~")) or _suffix(path) in _BUILDERS:
        _check_exists(str(p))
        files = [str(p)]
    else:  # a Hub dataset name
        return Source(path, None, None, weight, split, text_column, name)
    _no_config_name(path, name)
    builders = {_BUILDERS.get(_suffix(f)) for f in files}
    if None in builders or len(builders) != 1:
        suffixes = sorted({_suffix(f) for f in files})
        most = max(suffixes, key=[_suffix(f) for f in files].count)
        glob_ = f"; read one kind with a glob, e.g. '{path.rstrip('/')}/**/*{most}'" if p.is_dir() else ""
        raise DataError(f"dataset '{path}': expected files of one kind among {sorted(set(_BUILDERS))}, "
                        f"got {suffixes}{glob_}")
    for f in files:
        _check_exists(f)  # contents are checked by check_source, only when the source is actually read
    return Source(path, files, builders.pop(), weight, split, text_column, name)


def check_source(src: Source) -> None:
    """Read a local source's files (the first 256 MB of each) for UTF-8 and some text, before preparing.

    Not part of `resolve_source`: reusing a prepared folder (every rank, every run) must not re-read
    the whole corpus."""
    if src.builder == SAVED:  # Arrow, written by `datasets` itself: load_from_disk checks it
        return
    for f in src.files or ():
        _check_file(f)


def load_source(src: Source, streaming: bool, cache_dir: str | os.PathLike | None = None):
    """A datasets (Iterable)Dataset with a single 'text' column.

    ``cache_dir``: where `datasets` writes the Arrow copy of local files (prepare passes a folder
    inside its temporary output, deleted when done: the token shards are the cache that matters,
    and a second Arrow copy of a large corpus in ~/.cache/huggingface would only take disk).
    Hub datasets keep the default datasets cache (their downloads are worth keeping)."""
    import datasets

    if src.files is not None and src.builder != SAVED and src.split != "train":  # read whole: never a silent no-op
        raise DataError(f"dataset '{src.path}': local files have one split, 'train' (split '{src.split}' selects a "
                        "split of a Hub dataset or of a save_to_disk folder); leave dataset_split unset")
    local = {} if cache_dir is None else {"cache_dir": str(cache_dir)}
    try:
        if src.files is None:
            ds = datasets.load_dataset(hub_path(src.path), src.name, split=src.split, streaming=streaming)
        elif src.builder == SAVED:
            ds = _load_saved(src, streaming)
        elif src.builder == "text":
            ds = datasets.load_dataset("text", data_files=src.files, split="train", streaming=streaming,
                                       sample_by="document", **local)
        else:
            ds = datasets.load_dataset(src.builder, data_files=src.files, split="train", streaming=streaming,
                                       **local)
    except DataError:
        raise
    except ConnectionError as e:  # datasets: "Couldn't reach 'X' on the Hub (OfflineModeIsEnabled)"
        raise DataError(hub_unreachable(src.path, first_line(e)[:120])) from None
    except Exception as e:  # noqa: BLE001 -- bad parquet, unknown config, ...: any failure becomes one line
        if is_no_space(e):
            raise _cache_full(src, cache_dir) from None
        first = first_line(e, type(e).__name__)
        raise DataError(f"dataset '{src.path}': could not be loaded ({_bad_json_line(src) or first[:300]})") \
            from None
    if src.text_template is not None:
        return _templated(ds, src)
    cols = list(ds.column_names or [])
    if not cols and streaming:  # streamed CSV/JSON: columns are known only once a row is read
        cols = list(_first(ds, src))
    if cols and src.text_column not in cols:
        names = ", ".join(" ".join(str(c).split())[:40] for c in cols[:20]) + (", ..." if len(cols) > 20 else "")
        looks_like_text = any(" " in str(c).strip() or len(str(c)) > 40 for c in cols)  # a document, not a name
        header = " (is its first row a header?)" if src.builder == "csv" and looks_like_text else ""
        raise DataError(f"dataset '{src.path}': no column '{src.text_column}' (columns: {names}){header}; "
                        "set text_column")
    ds = ds.select_columns([src.text_column])
    return ds if src.text_column == "text" else ds.rename_column(src.text_column, "text")


def text_values(values: list, src: Source, fix: str | None = None) -> list[str]:
    """A batch of a source's text column as strings. A null is an empty document (skipped, docs/data.md); any
    other value (a number, a list, a dict) is one line naming the column and its type: a row silently dropped
    would train on less than the user's data. ``fix``: the advice (default: the text_column/template keys)."""
    for v in values:
        if v is not None and not isinstance(v, str):
            fix = fix or "convert them or set " + ("text_column or " if src.text_template is None else "") + \
                "text_template"
            raise DataError(f"dataset '{src.path}': column '{src.text_column}' holds {type(v).__name__} values "
                            f"(e.g. {str(v)[:40]!r}), expected text; {fix}")
    # a .txt file's byte-order mark (Windows editors write one) is not text: datasets keeps it (its utf-8-sig
    # is lost on a .gz), the json and csv readers drop it
    bom = "\ufeff" if src.builder == "text" else ""
    return [(v or "").removeprefix(bom) for v in values]


def _bad_json_line(src: Source) -> str | None:
    """The first line of a JSON Lines source that is not JSON, as "FILE line N: why" (datasets says only "An
    error occurred while generating the dataset"); None: none found. Read only after a failed load."""
    if src.builder != "json":
        return None
    for f in src.files or ():
        try:
            with (gzip.open if f.endswith(".gz") else open)(f, "rt", encoding="utf-8") as lines:
                if f.removesuffix(".gz").endswith(".json") and lines.read(1) in "[{":
                    continue  # one JSON document, not JSON Lines
                lines.seek(0)
                for n, line in enumerate(lines, 1):
                    try:
                        json.loads(line) if line.strip() else None
                    except ValueError as e:
                        return f"{f} line {n}: not JSON ({str(e)[:120]})"
        except (OSError, ValueError):  # unreadable or not UTF-8: the library's own message stands
            return None
    return None


def _load_saved(src: Source, streaming: bool):
    """A save_to_disk folder: its Dataset, or its DatasetDict's ``split`` (memory-mapped: no Arrow copy)."""
    import datasets

    ds = datasets.load_from_disk(str(Path(src.path).expanduser()))
    if isinstance(ds, datasets.DatasetDict):
        if src.split not in ds:
            raise DataError(f"dataset '{src.path}': no split '{src.split}' (splits: {', '.join(ds)}); "
                            "set dataset_split")
        ds = ds[src.split]
    elif src.split != "train":  # a Dataset is read whole: a split asked of it must not be a silent no-op
        raise DataError(f"dataset '{src.path}': a save_to_disk Dataset has no splits (split '{src.split}' selects a "
                        "split of a DatasetDict or a Hub dataset); leave dataset_split unset")
    return ds.to_iterable_dataset() if streaming else ds


def _cache_full(src: Source, cache_dir) -> DataError:
    """Writing datasets' Arrow copy (or a Hub download) ran out of space: where, and about how much it needs."""
    import datasets

    where = Path(cache_dir or datasets.config.HF_DATASETS_CACHE)
    probe = next((p for p in (where, *where.parents) if p.exists()), Path("/"))
    need = (f"about {sum(os.path.getsize(f) for f in src.files):,} bytes (the size of its files)" if src.files
            else "more")
    return DataError(f"disk full: datasets' cache {where} needs {need} for dataset '{src.path}', "
                     f"{shutil.disk_usage(probe).free:,} free: free space or point HF_DATASETS_CACHE / YXANUL_CACHE "
                     "elsewhere")


def _first(ds, src: Source) -> dict:
    """The first example ({} if none); a broken file is one line."""
    try:
        if hasattr(ds, "num_rows") and ds.num_rows is not None:
            return ds[0] if ds.num_rows else {}
        return next(iter(ds.take(1)), {})
    except Exception as e:  # noqa: BLE001 -- a broken file: one line
        raise DataError(f"dataset '{src.path}': could not be read ({first_line(e, type(e).__name__)[:300]})") from None


def _templated(ds, src: Source):
    """The source's ``text`` built by its ``text_template``, checked on its first example first."""
    first = _first(ds, src)
    if first:
        check_first_example(src.text_template, first, src.path)
    cols = list(ds.column_names or first)
    return ds.map(render_batch, batched=True, with_indices=True, remove_columns=cols,
                  fn_kwargs={"template": src.text_template, "source": src.path})


HUB_MIRROR = "YXANUL_HUB_MIRROR"


def hub_path(name: str) -> str:
    """What `load_dataset` gets for a Hub name: the name itself, or ``$YXANUL_HUB_MIRROR/<name>`` when that
    folder exists (a local copy of the dataset repository, e.g. from ``hf download
    --repo-type dataset NAME --local-dir MIRROR/NAME``): the same `load_dataset(path, name, split,
    streaming)` call reads it, configs (README ``configs:``) included."""
    mirror = os.environ.get(HUB_MIRROR)
    if mirror and (Path(mirror) / name).is_dir():
        return str(Path(mirror) / name)
    return name


def hub_unreachable(name: str, why: str = "") -> str:
    return (f"dataset '{name}': the Hugging Face Hub is unreachable from here{f' ({why})' if why else ''}; to prepare "
            f"offline, download it where the Hub is reachable (hf download --repo-type dataset {name} "
            f"--local-dir MIRROR/{name}) and set {HUB_MIRROR}=MIRROR, or point dataset/datasets at its local "
            "parquet/jsonl files")


def check_hub_reachable(sources: list[Source], timeout: float = 3.0) -> None:
    """Hub sources need the Hub: say so in one line at once, instead of datasets' 25 s of retries and a
    multi-line log. Skipped in offline mode (datasets then fails fast) and for mirrored names."""
    hub = [s for s in sources if s.files is None and hub_path(s.path) == s.path]
    if not hub or os.environ.get("HF_DATASETS_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return
    why = hub_unreachable_why(timeout)
    if why:
        raise DataError(hub_unreachable(hub[0].path, why))


def hub_unreachable_why(timeout: float = 3.0) -> str | None:
    """Why the Hub's endpoint cannot be reached (one TCP connect, ``timeout`` s), or None: it can, or offline mode
    is on (then the libraries fail fast themselves). What datasets and transformers would find after ~25-50 s of
    retries and a multi-line log."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return None
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout).close()
    except OSError as e:
        return f"{url.hostname}: {e.strerror or type(e).__name__}"
    return None


def fingerprint(sources: list[Source], tokenizer: str, extra: dict) -> str:
    tok = Path(tokenizer)
    tok_id = tokenizer
    if tok.is_dir() and (tok / "tokenizer.json").is_file():
        tok_id = hashlib.sha256((tok / "tokenizer.json").read_bytes()).hexdigest()
    blob = json.dumps({"sources": [s.fingerprint() for s in sources], "tokenizer": tok_id, **extra}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
