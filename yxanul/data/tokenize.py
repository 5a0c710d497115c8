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

import itertools
import multiprocessing as mp
import os
from collections import deque

import numpy as np

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
            from .tiktoken_path import build_encoding

            enc = build_encoding(self.tiktoken_spec)
            n = 1 if single_thread else (os.cpu_count() or 1)
            return lambda texts: enc.encode_ordinary_batch(texts, num_threads=n)
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(self.tokenizer_json)
        tok.encode_special_tokens = True  # "<|endoftext|>" inside a document is text, not a boundary
        fast = getattr(tok, "encode_batch_fast", tok.encode_batch)  # no offsets: faster, same ids

        def encode(texts):
            if not single_thread:
                return [e.ids for e in fast(texts, add_special_tokens=False)]
            before = os.environ.get("TOKENIZERS_PARALLELISM")
            os.environ["TOKENIZERS_PARALLELISM"] = "false"  # read by `tokenizers` at every call
            try:
                return [e.ids for e in fast(texts, add_special_tokens=False)]
            finally:
                if before is None:
                    del os.environ["TOKENIZERS_PARALLELISM"]
                else:
                    os.environ["TOKENIZERS_PARALLELISM"] = before
        return encode


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
