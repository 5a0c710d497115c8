"""Tokenizing documents in worker processes: one process per core, each a single-threaded fast tokenizer.

The same function (:func:`encode_docs`) runs in the workers and in :mod:`yxanul.data.bench_data`'s
measurement, so the benchmark measures the code that prepares the data. Documents travel to a worker as
a list of strings and come back as one flat token array (EOS after every non-empty document) plus the
per-document lengths: no Python list per token crosses a process boundary.

Why processes and not the tokenizer's own threads: `tokenizers`' ``encode_batch`` parallelises one
batch with Rayon threads, but the Python side around it (reading Arrow/JSON, packing, writing) is
serial and holds the GIL; processes overlap all of it and scale with cores (docs/data.md has the
measurements). Workers are started with ``spawn`` (the trainer may call prepare after CUDA and
threads exist; ``fork`` would be unsafe there).
"""

from __future__ import annotations

import functools
import itertools
import multiprocessing as mp
import os
from collections import deque

import numpy as np

from .tiktoken_path import build_encoding

_STATE: dict = {}
LAZY_CHARS = 8 << 20  # start worker processes once this much text was submitted (see Pool)


class Encoder:
    """A picklable description of how to tokenize: the tokenizer's JSON, or tiktoken's ranks for a
    GPT-2-family byte-level BPE with identical ids (see :func:`yxanul.data.tiktoken_path.tiktoken_spec`)."""

    def __init__(self, tokenizer_json: str, eos: int, dtype: str, tiktoken_spec: dict | None = None):
        self.tokenizer_json, self.eos, self.dtype, self.tiktoken_spec = tokenizer_json, eos, dtype, tiktoken_spec

    @property
    def backend(self) -> str:
        return "tiktoken" if self.tiktoken_spec else "tokenizers"

    def build(self, single_thread: bool):
        """texts -> list of id lists; ``single_thread``: on one core (else the library's threads)."""
        if self.tiktoken_spec:
            enc = build_encoding(self.tiktoken_spec)
            n = 1 if single_thread else (os.cpu_count() or 1)
            return lambda texts: enc.encode_ordinary_batch(texts, num_threads=n)
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(self.tokenizer_json)
        tok.encode_special_tokens = True  # "<|endoftext|>" inside a document is text, not a boundary
        fast = getattr(tok, "encode_batch_fast", tok.encode_batch)  # no offsets: faster, same ids
        raw = functools.partial(fast, add_special_tokens=False)
        batch = functools.partial(_chunked, raw) if _split_safe(raw) else (lambda texts: [e.ids for e in raw(texts)])

        def encode(texts):
            if not single_thread:
                return batch(texts)
            before = os.environ.get("TOKENIZERS_PARALLELISM")
            os.environ["TOKENIZERS_PARALLELISM"] = "false"  # read by `tokenizers` at every call
            try:
                return batch(texts)
            finally:
                if before is None:
                    del os.environ["TOKENIZERS_PARALLELISM"]
                else:
                    os.environ["TOKENIZERS_PARALLELISM"] = before
        return encode


# `tokenizers` keeps per-byte alignments of the whole text it encodes: one 50 MB document peaked at 8.3 GB.
# A longer document is encoded in pieces of about CHUNK_CHARS, cut before a single space between two
# non-space characters, where a whitespace-splitting pre-tokenizer (byte-level BPE, Metaspace) starts a new
# word anyway: the same ids. `_split_safe` checks that on a probe; a tokenizer that fails it is not chunked.
CHUNK_CHARS = 1 << 20
_PROBE = "The quick brown fox, it's said, jumps over 12 lazy dogs.\nAnd then  it rests; well-earned!"


def _cuts(text: str, size: int) -> list[int]:
    """Start offsets of the pieces of ``text`` (0 first): each a single space between non-space characters,
    at or after every multiple of ``size`` (a text without such a space stays whole)."""
    starts, at = [0], size
    while at < len(text):
        i = text.find(" ", at)
        while i != -1 and (text[i - 1].isspace() or i + 1 >= len(text) or text[i + 1].isspace()):
            i = text.find(" ", i + 1)
        if i == -1:
            break
        starts.append(i)
        at = i + size
    return starts


def _chunked(raw, texts: list[str], size: int | None = None) -> list[list[int]]:
    """Ids of ``texts``, documents longer than ``size`` characters encoded in pieces (bounded memory)."""
    size = size or CHUNK_CHARS
    if max(map(len, texts), default=0) <= size:
        return [e.ids for e in raw(texts)]
    out = []
    for t in texts:
        starts = _cuts(t, size) + [len(t)]
        pieces = [t[a:b] for a, b in zip(starts, starts[1:])]
        out.append([i for k in range(0, len(pieces), 8) for e in raw(pieces[k:k + 8]) for i in e.ids])
    return out


def _split_safe(raw) -> bool:
    """True when encoding the probe in pieces gives the ids of encoding it whole."""
    return _chunked(raw, [_PROBE], size=8) == [e.ids for e in raw([_PROBE])]


def _init(encoder: Encoder, single_thread: bool) -> None:
    if single_thread:  # one core per process: the processes are the parallelism
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        os.environ["RAYON_NUM_THREADS"] = "1"
    _STATE["encode"], _STATE["encoder"] = encoder.build(single_thread), encoder


def encode_docs(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(flat tokens with EOS after each non-empty document, per-document length incl. EOS; 0 = empty)."""
    enc = _STATE["encoder"]
    ids = _STATE["encode"](texts)
    lengths = np.fromiter((len(x) + 1 if x else 0 for x in ids), dtype=np.int64, count=len(ids))
    eos = [enc.eos]
    flat = np.fromiter(itertools.chain.from_iterable(x + eos for x in ids if x), dtype=enc.dtype,
                       count=int(lengths.sum()))
    return flat, lengths


class Pool:
    """Ordered, bounded tokenization: ``submit(key, texts)`` then ``next(key)`` returns results per key in
    submission order. ``processes <= 1`` runs in this process. Workers start only once ``lazy_chars``
    characters were submitted (starting processes costs ~1 s: small corpora, like the bundled one, are
    tokenized in this process); where a batch is tokenized never changes its tokens."""

    def __init__(self, encoder: Encoder, processes: int, lazy_chars: int | None = None):
        self.encoder, self.processes = encoder, max(1, processes)
        self.lazy_chars = LAZY_CHARS if lazy_chars is None else lazy_chars
        self._queues: dict = {}
        self._chars, self._pool = 0, None
        # in this process: one core when asked for one process, else the tokenizer's own threads
        _STATE["encode"], _STATE["encoder"] = encoder.build(single_thread=self.processes == 1), encoder

    def _workers(self):
        if self._pool is None and self.processes > 1 and self._chars >= self.lazy_chars:
            ctx = mp.get_context("spawn")
            self._pool = ctx.Pool(self.processes, initializer=_init, initargs=(self.encoder, True))
        return self._pool

    def submit(self, key, texts: list[str]) -> None:
        self._chars += sum(map(len, texts))
        q, pool = self._queues.setdefault(key, deque()), self._workers()
        q.append(encode_docs(texts) if pool is None else pool.apply_async(encode_docs, (texts,)))

    def in_flight(self, key) -> int:
        return len(self._queues.get(key, ()))

    def next(self, key) -> tuple[np.ndarray, np.ndarray]:
        r = self._queues[key].popleft()
        return r if isinstance(r, tuple) else r.get()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()  # results not taken are not needed; never wait on a worker
            self._pool.join()
            self._pool = None
