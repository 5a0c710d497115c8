"""`yxanul prepare`: tokenize documents, append EOS, pack into fixed-size token shards + a validation split.

Output folder::

    meta.json              tokenizer, vocab_size, eos_token_id, dtype, per split: tokens, documents, shard
                           names and manifest (per shard: tokens, documents, tokens per source, sha256),
                           per source: documents, tokens, achieved shares; fingerprint, yxanul version
    tokenizer/             a copy of the tokenizer (the folder is self-contained)
    train_00000.bin ...    shards of exactly shard_size_tokens tokens, the last one shorter (shards.py)
    val_00000.bin
    verified.json          shards whose sha256/max id checked out, by size/mtime/inode (verify.py)

Pipeline: sources are read in batches of documents, tokenized by ``prepare_num_proc`` worker processes
(tokenize.py), mixed by weight (mixture.py) and written by the main process. The folder is built
in ``<dir>.partial`` (workdir.py) and renamed when complete, so a folder named ``<dir>`` is always
complete; killed at any moment, the next run continues from the last checkpoint (after every
completed shard and at least every ``CHECKPOINT_SECONDS``) and produces byte-identical files.
An existing complete folder with the same fingerprint (sources + tokenizer + settings) is reused.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from .. import __version__
from ..errors import DataError, is_no_space
from .args import DataArgs
from .entries import resolve_sources
from .mixture import Mixture, SourceStream
from .progress import progress_bar, report
from .remote_code import strip_code
from .shards import ShardWriter, dtype_for_vocab, resume_problem
from .sources import cache_root, check_hub_reachable, check_source, fingerprint
from .tiktoken_path import tiktoken_spec
from .tokenize import Encoder, Pool
from .tokenizer_load import load_tokenizer, vocab_size
from .verify import record_verified, verified
from .workdir import WorkDir, clean_stale

# 2: special-token strings inside documents are plain text (split_special_tokens)
# 3: fixed-size shards with a manifest, exact mixing by tokens or documents (mixture.py)
# 4: empty rows count toward no share nor max_documents; a document read more than once stays in its split;
#    tokenizers with added tokens that are not special never take tiktoken's path
FORMAT = 4
CHECKPOINT_SECONDS = 30.0


def is_val(doc_index: int, val_fraction: float) -> bool:
    """Deterministic hold-out by document index (hashed, so held-out documents are spread out)."""
    return (zlib.crc32(doc_index.to_bytes(8, "little")) % 1_000_000) < val_fraction * 1_000_000


def _settings(args: DataArgs, sources) -> dict:
    """Everything besides sources and tokenizer that changes the prepared bytes."""
    s = {"format": FORMAT, "val_fraction": args.val_fraction, "max_documents": args.max_documents,
         "shard_size_tokens": args.shard_size_tokens, "max_tokens": args.max_tokens}
    if args.streaming and args.shuffle_buffer:
        s |= {"shuffle_buffer": args.shuffle_buffer, "data_seed": args.data_seed}
    if any(src.max_epochs > 1 for src in sources):  # a re-read's order: streamed as is, else permuted by the seed
        s |= {"streaming": args.streaming, "data_seed": args.data_seed}
    s |= {"on_source_end": args.on_source_end} if args.on_source_end != "stop" else {}
    return s | ({"mix_by": args.mix_by} if len(sources) > 1 else {})


def target_dir(args: DataArgs, out_dir=None):
    """(output folder, sources, fingerprint, (tokenizer name, tokenizer))."""
    sources = resolve_sources(args)
    tok_name, tok = load_tokenizer(args.tokenizer, args.trust_remote_code)
    settings, vocab = _settings(args, sources), vocab_size(tok)
    if vocab != len(tok):  # ids with holes: a folder recording len(tok) as its vocab_size is not reused
        settings["vocab_size"] = vocab  # (only these fingerprints change: contiguous vocabularies' stay)
    fp = fingerprint(sources, tok_name, settings)
    out = Path(out_dir or args.data_dir or cache_root() / "data" / fp)
    return out, sources, fp, (tok_name, tok)


def read_meta(out: Path, fp: str | None = None) -> dict | None:
    """meta.json of a complete prepared folder (with fingerprint ``fp`` if given), else None."""
    try:
        meta = json.loads((Path(out) / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if fp is None or meta.get("fingerprint") == fp else None


def _num_proc(args: DataArgs) -> int:
    if args.prepare_num_proc:
        return args.prepare_num_proc
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _encoder(args: DataArgs, tok, dtype):
    spec = (None if args.prepare_backend == "tokenizers"
            else tiktoken_spec(tok, required=args.prepare_backend == "tiktoken"))
    return Encoder(tok.backend_tokenizer.to_str(), tok.eos_token_id, dtype.__name__, spec)


class _Packer:
    """The main loop: mixed documents -> train/val writers, checkpointing into the work folder."""

    def __init__(self, args: DataArgs, sources, work, fp: str, encoder, state: dict | None):
        st = state or {}
        self.args, self.work, self.fp, self.names = args, work, fp, [s.key for s in sources]
        self.mix = Mixture(sources, args.mix_by, args.max_tokens, st.get("mix"), args.on_source_end)
        dtype = __import__("numpy").dtype(encoder.dtype)
        self.writers = {s: ShardWriter(work.path, s, dtype, args.shard_size_tokens, encoder.eos,
                                       st.get("writers", {}).get(s)) for s in ("train", "val")}
        self.doc_index = self.start_index = int(st.get("doc_index", 0))
        self.tokens0 = sum(w.tokens for w in self.writers.values())
        self.pool = Pool(encoder, _num_proc(args))
        self.sources = sources
        self.streams = [None if self.mix.dropped[i] else self._open(i) for i in range(len(sources))]
        self.pending = None  # (split, ids, source): one document of lag, see finish()
        self._saved_at, self._shards_at_save = time.monotonic(), self._shards()

    def _open(self, i: int):
        """Source ``i`` read from where the mixture's state says: its epoch, after the documents taken in it."""
        a, m = self.args, self.mix
        return SourceStream(i, self.sources[i], self.pool, a.streaming, m.epoch_docs[i], a.shuffle_buffer, a.data_seed,
                            self.work.arrow_cache, prefetch=2 * self.pool.processes + 1, epoch=m.epoch[i])

    def _next(self):
        """(source, tokens) of the next document, or (None, None) at the mixture's end; a source at its end is
        read again (its next epoch), leaves the mixture, or ends it (mixture.py)."""
        while True:
            i = self.mix.pick()
            if i is None:
                return None, None
            ids = self.streams[i].next_doc()
            if ids is not None:
                return i, ids
            again = self.mix.source_ended(i)
            if not again and self.mix.on_end == "stop":  # mix.ended_by says which source and how
                return None, None
            self.streams[i] = self._open(i) if again else None

    def _split(self, i: int, ids) -> str:
        """Hashed hold-out by document index; by its tokens in a source read more than once (copies: one split)."""
        if self.mix.max_epochs[i] > 1:
            return "val" if zlib.crc32(ids.tobytes()) % 1_000_000 < self.args.val_fraction * 1_000_000 else "train"
        return "val" if is_val(self.doc_index, self.args.val_fraction) else "train"

    def _shards(self) -> int:
        return sum(w.shards_done for w in self.writers.values())

    def checkpoint(self) -> None:
        """Save the state as of just before the pending document (it is read again on resume)."""
        for w in self.writers.values():
            w.flush()
        mix = self.mix.state()
        if self.pending is not None:
            i, n = self.pending[2], len(self.pending[1])
            mix["docs"][i] -= 1
            mix["epoch_docs"][i] -= 1
            mix["tokens"][i] -= n
        self.work.save({"fingerprint": self.fp, "doc_index": self.doc_index, "mix": mix,
                        "writers": {s: w.state() for s, w in self.writers.items()}})
        self._saved_at, self._shards_at_save = time.monotonic(), self._shards()

    def run(self, bar) -> None:
        a = self.args
        while a.max_documents is None or self.doc_index < a.max_documents:
            i, ids = self._next()
            if ids is None:
                break
            self.mix.took(i, len(ids))
            if not len(ids):  # an empty row: read (a resume skips it), not a document
                continue
            if self.pending is not None:
                self.writers[self.pending[0]].add(self.pending[1], self.names[self.pending[2]])
            self.pending = (self._split(i, ids), ids, i)
            if self._shards() != self._shards_at_save or time.monotonic() - self._saved_at > CHECKPOINT_SECONDS:
                self.checkpoint()
            bar.update(len(ids))
            self.doc_index += 1

    def cut_short(self) -> str | None:
        """The cap that ended the reading before the data ran out (``max_tokens`` in total or of a source,
        ``max_documents``), which an error about too few documents names; None: the data ran out."""
        a, m = self.args, self.mix
        if a.max_tokens is not None and sum(m.tokens) >= a.max_tokens:
            return f"max_tokens {a.max_tokens:,}"
        if m.ended_by and m.ended_by[1] != "ran out":
            return f"the max_tokens {m.caps[m.ended_by[0]]:,} of '{self.names[m.ended_by[0]]}'"
        if a.max_documents is not None and self.doc_index >= a.max_documents:
            return f"max_documents {a.max_documents:,}"
        return None

    def finish(self) -> dict:
        """Write the last document (to the split that is still empty, if one is, unless its source was read more
        than once: a copy of it may be in the other split) and close the shards."""
        if self.pending is not None:
            split, tr, va = self.pending[0], self.writers["train"], self.writers["val"]
            if self.mix.max_epochs[self.pending[2]] == 1:
                if va.documents == 0 and tr.documents:
                    split = "val"
                elif tr.documents == 0 and va.documents:
                    split = "train"  # every earlier document was held out: the last one trains
            self.writers[split].add(self.pending[1], self.names[self.pending[2]])
        return {s: w.close() for s, w in self.writers.items()}


def _pack(args: DataArgs, sources, work, fp: str, tok, dtype, progress: bool):
    """Run (or continue) the packing in ``work``; returns (splits, mixture report, packer)."""
    state = work.progress(fp)
    if state is None:
        work.reset()
    packer = _Packer(args, sources, work, fp, _encoder(args, tok, dtype), state)
    bar = progress_bar(packer, args, progress)
    t0 = time.perf_counter()
    try:
        packer.run(bar)
        splits = packer.finish()
        packer.seconds = time.perf_counter() - t0  # the packing phase alone: read, tokenize, mix, write
    finally:
        bar.close()
        packer.pool.close()
    return splits, packer


def prepare(args: DataArgs, out_dir=None, progress: bool = True, *, say=print, create: bool = True) -> Path:
    """Tokenize + pack ``args``' sources into ``out_dir`` (default ``args.data_dir``, else the cache);
    reuse the folder if it is complete with the same fingerprint. Returns the folder."""
    out, sources, fp, (tok_name, tok) = target_dir(args, out_dir)
    if read_meta(out, fp):
        say(f"data: reusing prepared shards in {out}")
        return out
    if not create:
        raise DataError(f"data_dir '{out}': not prepared "
                        "(this node's main process failed to prepare it; see its error)")
    _check_target(out)
    for src in sources:  # every file's text is checked before anything is written
        check_source(src)
    check_hub_reachable(sources)
    work = WorkDir(out)
    work.acquire()  # another process preparing the same folder: wait for it, then reuse its result
    try:
        if read_meta(out, fp):
            work.discard()
            say(f"data: reusing prepared shards in {out}")
            return out
        _check_target(out)
        clean_stale(out.parent, keep=work.path, out_name=out.name)
        resumed = work.progress(fp)
        damaged = resumed and next(filter(None, (resume_problem(work.path, split, w) for split, w in
                                                 resumed.get("writers", {}).items())), None)
        if damaged:  # resuming would vouch for shards that are not what was written: start over instead
            say(f"warning: data: {damaged} in {work.path} is not what the interrupted run wrote; preparing "
                f"{out} from the start")
            work.reset()
        elif resumed:
            say(f"data: resuming in {work.path} after document {resumed['doc_index']:,}")
        t0, dtype = time.monotonic(), dtype_for_vocab(vocab_size(tok))
        splits, packer = _pack(args, sources, work, fp, tok, dtype, progress)
        _finish(work, args, sources, fp, tok_name, tok, dtype, splits, packer)
    except DataError:
        work.discard()  # bad input: nothing worth resuming
        raise
    except BaseException as e:
        work.drop_arrow_cache()  # the shards stay for a restart; the Arrow copy of the input goes now
        work.release()
        if is_no_space(e):
            raise work.disk_full(args.shard_size_tokens * dtype_for_vocab(vocab_size(tok))().itemsize) from None
        raise
    report(say, out, splits, packer, time.monotonic() - t0)
    return out


def _check_target(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if read_meta(out):
            raise DataError(f"data_dir '{out}': holds shards prepared from other sources/tokenizer/settings; "
                            "choose another data_dir or delete it")
        raise DataError(f"data_dir '{out}': exists and is not a prepared data folder")


def _finish(work, args, sources, fp, tok_name, tok, dtype, splits, packer) -> None:
    if not splits["train"]["documents"] or not splits["val"]["documents"]:
        n = splits["train"]["documents"] + splits["val"]["documents"]
        what = ("no text" if n == 0 else "one document only: too few to hold one out for validation" if n == 1 else
                f"no document of {n} was held out for {'validation' if splits['train']['documents'] else 'training'}"
                f" (val_fraction {args.val_fraction}; every copy of a document read more than once takes one split)")
        cut = packer.cut_short()
        raise DataError(f"dataset '{sources[0].path}': {what}" + (f"; {cut} ended the reading there: raise it" if cut
                                                                  else ""))

    tok.save_pretrained(work.path / "tokenizer")
    strip_code(work.path / "tokenizer")  # the folder never keeps code that came with a tokenizer

    meta = {"format": FORMAT, "fingerprint": fp, "tokenizer": tok_name, "tokenizer_dir": "tokenizer",
            "vocab_size": vocab_size(tok), "eos_token_id": tok.eos_token_id, "dtype": dtype.__name__,
            "splits": splits, "val_fraction": args.val_fraction,  # a trainer given the folder alone compares it
            "sources": [s.key for s in sources], "mix_by": args.mix_by, "mixture": packer.mix.report(),
            "shard_size_tokens": args.shard_size_tokens, "yxanul_version": __version__,
            "stats": {"pack_seconds": round(packer.seconds, 3), "processes": packer.pool.processes,
                      "backend": packer.pool.encoder.backend},
            "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    record_verified(work.path, meta)  # the writers have just hashed every shard: no re-read at the first start
    (work.path / "meta.json").write_text(json.dumps(meta, indent=2))  # before the rename: marks it complete
    work.finish()


def given_prepared(args: DataArgs) -> bool:
    """A ``data_dir`` given alone (no dataset, datasets or tokenizer): a folder prepared before, used as is."""
    return bool(args.data_dir) and args.dataset is None and args.datasets is None and args.tokenizer is None


def planned_fingerprint(args: DataArgs) -> str | None:
    """The fingerprint of the data ``args`` will train on (meta.json's, once prepared), known before anything is
    prepared (it loads the tokenizer); None for a ``data_dir`` given alone that holds no prepared data."""
    if given_prepared(args):
        return (read_meta(Path(args.data_dir)) or {}).get("fingerprint")
    return target_dir(args)[2]


def ensure_prepared(args: DataArgs, is_main_process: bool = True, wait: Callable[[], None] | None = None,
                    *, say=print) -> Path:
    """The prepared folder for ``args``, preparing it if needed (used by the trainer).

    A ``data_dir`` holding a complete prepared folder, given without ``dataset``/``datasets``/
    ``tokenizer``, is used as is. With a barrier ``wait`` (e.g. ``accelerator.wait_for_everyone``)
    the process given ``is_main_process`` prepares, then everybody meets at the barrier (it also when
    it failed, so the others don't hang) and the others reuse the folder. The trainer passes each
    node's *local* main process: a node-local cache (the default ``~/.cache/yxanul``) is then
    prepared on every node, and on a shared filesystem the nodes take turns on the work folder's lock
    (the first prepares, the others reuse its folder). Without ``wait``, call it inside
    ``state.main_process_first()``.
    """
    def quiet(*a, **k):
        return None

    if given_prepared(args):
        def get(**_):  # a folder given alone must already be prepared: a typo must not pack the demo corpus
            if read_meta(Path(args.data_dir)):
                return Path(args.data_dir)
            if (Path(args.data_dir) / "meta.json").is_file():
                raise DataError(f"data_dir '{args.data_dir}': its meta.json is damaged (not the JSON `yxanul "
                                "prepare` writes); delete the folder and prepare it again")
            raise DataError(f"data_dir '{args.data_dir}': no prepared shards (no meta.json); run `yxanul prepare "
                            "--data_dir ...` first, or set dataset/datasets to prepare it here")
    else:
        def get(**kw):
            return prepare(args, **kw)
    if wait is None:
        return verified(get(progress=is_main_process, say=say if is_main_process else quiet),
                        say if is_main_process else quiet)
    if is_main_process:  # every rank meets at the barrier exactly once, whatever happens
        try:
            return verified(get(progress=True, say=say), say)
        finally:
            wait()
    wait()
    return verified(get(progress=False, say=quiet, create=False), quiet)  # the main process's verification cached
