"""The document stream `yxanul prepare` packs: sources read in batches, tokenized in worker processes,
mixed by weight, with an exact, resumable state.

Mixing is deterministic and exact rather than random (`datasets.interleave_datasets` samples a source
per document with the given probabilities, so shares drift by chance and it only knows documents):
the next document comes from the source furthest below its share, ``count_s / weight_s`` smallest,
where count is tokens (``mix_by: tokens``, the default: a weight is a share of the training tokens)
or documents (``mix_by: documents``). The achieved share is then within one document of the weight at
every point. The mixture ends when its first source ends or reaches its ``max_tokens`` ('first
exhausted', like torchtitan/nanochat mixtures): the weights hold and no document repeats.

State = per source (documents consumed, tokens taken): restarting from a state reads each source
from that document on (``skip``; a streamed source re-reads, but does not re-tokenize, what it
skips) and makes the same choices, so a resumed preparation is byte-identical to an uninterrupted one.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .sources import Source, load_source

BATCH_DOCS = 256  # documents per tokenization task: big enough to amortise IPC, small for memory


class SourceStream:
    """One source's documents as token arrays (EOS included; empty array = an empty document)."""

    def __init__(self, key: int, src: Source, pool, streaming: bool, skip: int, shuffle_buffer: int, seed: int,
                 cache_dir=None, prefetch: int = 4):
        ds = load_source(src, streaming, cache_dir)
        if streaming and shuffle_buffer:  # datasets' own buffer shuffle, deterministic by seed
            ds = ds.shuffle(seed=seed, buffer_size=shuffle_buffer)
        if skip:
            ds = ds.skip(skip)
        self.key, self.pool, self.prefetch = key, pool, prefetch
        self._batches = ds.iter(batch_size=BATCH_DOCS)
        self._docs: deque = deque()
        self._eof = False
        self.num_rows = getattr(ds, "num_rows", None)

    def _fill(self) -> None:
        while not self._eof and self.pool.in_flight(self.key) < self.prefetch:
            try:
                batch = next(self._batches)
            except StopIteration:
                self._eof = True
                return
            self.pool.submit(self.key, [t if isinstance(t, str) else "" for t in batch["text"]])

    def next_doc(self) -> np.ndarray | None:
        """The next document's tokens, or None when the source is exhausted."""
        if not self._docs:
            self._fill()
            if not self.pool.in_flight(self.key):
                return None
            flat, lengths = self.pool.next(self.key)
            self._docs.extend(np.split(flat, np.cumsum(lengths)[:-1]))
            self._fill()
        return self._docs.popleft()


class Mixture:
    """Weighted, exact, resumable choice among sources."""

    def __init__(self, sources: list[Source], mix_by: str, max_tokens: int | None, state: dict | None = None):
        total = sum(s.weight for s in sources)
        self.names = [s.path for s in sources]
        self.weights = [s.weight / total for s in sources]
        self.caps = [getattr(s, "max_tokens", None) for s in sources]
        self.mix_by, self.max_tokens = mix_by, max_tokens
        st = state or {}
        self.docs = list(st.get("docs", [0] * len(sources)))
        self.tokens = list(st.get("tokens", [0] * len(sources)))

    def state(self) -> dict:
        return {"docs": list(self.docs), "tokens": list(self.tokens)}

    def pick(self) -> int | None:
        """The source of the next document; None when the mixture is complete."""
        if self.max_tokens is not None and sum(self.tokens) >= self.max_tokens:
            return None
        if any(cap is not None and t >= cap for cap, t in zip(self.caps, self.tokens)):
            return None
        counts = self.tokens if self.mix_by == "tokens" else self.docs
        return min(range(len(self.weights)), key=lambda i: (counts[i] / self.weights[i], i))

    def took(self, i: int, n_tokens: int, sign: int = 1) -> None:
        self.docs[i] += sign
        self.tokens[i] += sign * n_tokens

    def report(self) -> dict:
        """Per source: documents, tokens, achieved share (of tokens and of documents) and weight."""
        T, D = max(sum(self.tokens), 1), max(sum(self.docs), 1)
        return {n: {"documents": d, "tokens": t, "token_share": round(t / T, 6), "document_share": round(d / D, 6),
                    "weight": round(w, 6)}
                for n, d, t, w in zip(self.names, self.docs, self.tokens, self.weights)}
