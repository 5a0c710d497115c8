"""`yxanul prepare`: tokenize documents, append EOS, pack into flat token shards + a validation split.

Output folder::

    meta.json              tokenizer, vocab_size, eos_token_id, dtype, per-split token/document counts
    train_00000.bin ...    shards (see shards.py)
    val_00000.bin

The folder is written as ``<dir>.tmp-<pid>`` and renamed when complete, so a killed prepare never
leaves a folder that looks finished; an existing complete folder with the same fingerprint
(sources + tokenizer + settings) is reused.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import zlib
from pathlib import Path

from ..errors import DataError
from .args import DataArgs
from .shards import ShardWriter, dtype_for_vocab
from .sources import BUNDLED_TOKENIZER, fingerprint, mixed_dataset, resolve_sources

FORMAT = 1


def cache_root() -> Path:
    return Path(os.environ.get("YXANUL_CACHE", Path.home() / ".cache" / "yxanul"))


def load_tokenizer(name_or_path: str | None):
    from transformers import AutoTokenizer

    name = name_or_path or str(BUNDLED_TOKENIZER)
    try:
        tok = AutoTokenizer.from_pretrained(name)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"tokenizer '{name}': could not be loaded ({first[:200]})") from None
    if tok.eos_token_id is None:
        raise DataError(f"tokenizer '{name}': has no EOS token (needed to separate packed documents)")
    return name, tok


def is_val(doc_index: int, val_fraction: float) -> bool:
    """Deterministic hold-out by document index (hash, so held-out documents are spread out)."""
    return (zlib.crc32(doc_index.to_bytes(8, "little")) % 1_000_000) < val_fraction * 1_000_000


def _settings(args: DataArgs) -> dict:
    return {"format": FORMAT, "val_fraction": args.val_fraction, "max_documents": args.max_documents,
            "shard_size_tokens": args.shard_size_tokens}


def target_dir(args: DataArgs) -> tuple[Path, list, str, object]:
    sources = resolve_sources(args)
    tok_name, tok = load_tokenizer(args.tokenizer)
    fp = fingerprint(sources, tok_name, _settings(args))
    out = Path(args.data_dir) if args.data_dir else cache_root() / "data" / fp
    return out, sources, fp, (tok_name, tok)


def _complete(out: Path, fp: str | None) -> dict | None:
    meta_path = out / "meta.json"
    if not meta_path.is_file():
        return None
    meta = json.loads(meta_path.read_text())
    return meta if fp is None or meta.get("fingerprint") == fp else None


def prepare(args: DataArgs, seed: int = 0, progress: bool = True, say=print) -> Path:
    out, sources, fp, (tok_name, tok) = target_dir(args)
    if _complete(out, fp):
        say(f"data: reusing prepared shards in {out}")
        return out
    if out.exists() and any(out.iterdir()):
        if (out / "meta.json").is_file():
            raise DataError(f"data_dir '{out}': holds shards prepared from other sources/tokenizer; "
                            "choose another data_dir or delete it")
        raise DataError(f"data_dir '{out}': exists and is not empty")
    from tqdm.auto import tqdm

    t0 = time.time()
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    vocab = len(tok)
    dtype = dtype_for_vocab(vocab)
    writers = {s: ShardWriter(tmp, s, dtype, args.shard_size_tokens) for s in ("train", "val")}
    ds = mixed_dataset(sources, args.streaming, seed)
    eos = tok.eos_token_id
    n_proc = args.prepare_num_proc or min(8, os.cpu_count() or 1)
    bar = tqdm(desc="tokenizing", unit="doc", disable=not progress, total=getattr(ds, "num_rows", None))
    doc_index = 0
    try:
        if not args.streaming and n_proc > 1 and len(ds) >= 10_000:
            ds = ds.map(lambda b: {"ids": tok(b["text"], add_special_tokens=False)["input_ids"]}, batched=True,
                        num_proc=n_proc, remove_columns=["text"], desc="tokenizing")
            batches = (b["ids"] for b in ds.iter(batch_size=1000))
        else:  # the fast tokenizer parallelises a batch across threads itself
            batches = (tok(b["text"], add_special_tokens=False)["input_ids"] for b in ds.iter(batch_size=1000))
        for ids_batch in batches:
            for ids in ids_batch:
                if args.max_documents is not None and doc_index >= args.max_documents:
                    break
                if ids:
                    writers["val" if is_val(doc_index, args.val_fraction) else "train"].add(ids + [eos])
                doc_index += 1
            bar.update(len(ids_batch))
            if args.max_documents is not None and doc_index >= args.max_documents:
                break
        bar.close()
        splits = {s: w.close() for s, w in writers.items()}
        if splits["train"]["tokens"] == 0:
            raise DataError(f"dataset '{sources[0].path}': no text to train on")
        if splits["val"]["tokens"] == 0:  # tiny datasets: hold out the last document instead
            raise DataError(f"dataset '{sources[0].path}': too few documents for a validation split "
                            f"({doc_index}); raise val_fraction")
        meta = {"format": FORMAT, "fingerprint": fp, "tokenizer": tok_name, "vocab_size": vocab,
                "eos_token_id": eos, "dtype": str(dtype.__name__), "splits": splits,
                "sources": [s.path for s in sources], "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    dt = time.time() - t0
    n = splits["train"]["tokens"] + splits["val"]["tokens"]
    say(f"data: {doc_index:,} documents -> train {splits['train']['tokens']:,} / val {splits['val']['tokens']:,} "
        f"tokens ({dtype.__name__}) in {dt:.1f}s ({n / max(dt, 1e-9):,.0f} tok/s) -> {out}")
    return out


def ensure_prepared(args: DataArgs, is_main_process: bool = True, seed: int = 0, say=print) -> Path:
    """Main process prepares (or reuses); call it inside ``state.main_process_first()`` so the other
    ranks run it afterwards and find the finished folder."""
    if args.data_dir and _complete(Path(args.data_dir), None) and args.dataset is None and args.datasets is None \
            and args.tokenizer is None:
        return Path(args.data_dir)  # a prepared folder given alone: use it as is
    return prepare(args, seed=seed, progress=is_main_process, say=say if is_main_process else (lambda *a, **k: None))


def main(argv: list[str] | None = None) -> int:
    """`yxanul prepare [--dataset ...] [--tokenizer ...] [--data_dir ...]`."""
    from ..config import _OneLineParser, _coerce
    import dataclasses
    import typing

    parser = _OneLineParser(prog="yxanul prepare", description="Tokenize and pack a dataset into token shards.")
    hints = typing.get_type_hints(DataArgs)
    for f in dataclasses.fields(DataArgs):
        if f.name in ("datasets", "num_workers"):
            continue
        parser.add_argument(f"--{f.name}", default=f.default, help=f.metadata.get("help"))
    ns = vars(parser.parse_args(argv))
    values = {k: _coerce(k, hints[k], v, from_cli=True) if isinstance(v, str) else v for k, v in ns.items()}
    out = prepare(DataArgs(**values))
    meta = json.loads((out / "meta.json").read_text())
    print(json.dumps({k: meta[k] for k in ("tokenizer", "vocab_size", "dtype")} |
                     {s: {k: v for k, v in d.items() if k != "shards"} for s, d in meta["splits"].items()}))
    return 0
