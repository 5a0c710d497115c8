"""The document stream `yxanul prepare` packs: sources read in batches, tokenized in worker processes,
mixed by weight, with an exact, resumable state.

Mixing is deterministic and exact rather than random (`datasets.interleave_datasets` samples a source
per document with the given probabilities, so shares drift by chance and it only knows documents):
the next document comes from the source furthest below its share, ``count_s / weight_s`` smallest,
where count is tokens (``mix_by: tokens``, the default: a weight is a share of the training tokens)
or documents (``mix_by: documents``). The achieved share is then within one document of the weight at
every point.

A source may be read ``max_epochs`` times (default 1): at its end it starts again, in a new order
where a shuffle applies (a streamed source with a shuffle buffer: the buffer's seed; a local source
read without streaming: a full permutation; seeded by ``data_seed`` and the epoch, the first pass
keeping the plain order). A source ends when its last epoch ends or it reaches its ``max_tokens``;
``on_source_end`` says what then happens: ``stop`` (default) ends the mixture ('first exhausted', like
torchtitan/nanochat mixtures: the weights hold to the end), ``drop`` takes the source out and the
others go on, their weights renormalised among themselves, until ``max_tokens`` in total or the last
source ends (the achieved shares then differ from the weights: they say what really happened).

State = per source (documents consumed, tokens taken, epoch, documents of the epoch, ended, dropped
at): restarting from a state reads each source from that epoch and document on (``skip``; a streamed
source re-reads, but does not re-tokenize, what it skips) and makes the same choices, so a resumed
preparation is byte-identical to an uninterrupted one.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .sources import Source, load_source, text_values

BATCH_DOCS = 256  # documents per tokenization task: big enough to amortise IPC, small for memory


def epoch_seed(seed: int, epoch: int) -> int:
    """The shuffle seed of a source's ``epoch``: ``seed`` itself for the first (unchanged order)."""
    return seed if epoch == 0 else int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def _ordered(ds, streaming: bool, shuffle_buffer: int, seed: int, epoch: int):
    if streaming and shuffle_buffer:  # datasets' own buffer shuffle, deterministic by seed
        return ds.shuffle(seed=epoch_seed(seed, epoch), buffer_size=shuffle_buffer)
    if epoch and not streaming:  # a re-read of a local source: a full permutation (indices, in memory)
        return ds.shuffle(seed=epoch_seed(seed, epoch), keep_in_memory=True)
    return ds


class SourceStream:
    """One source's documents (one epoch) as token arrays (EOS included; empty array = an empty document)."""

    def __init__(self, key: int, src: Source, pool, streaming: bool, skip: int, shuffle_buffer: int, seed: int,
                 cache_dir=None, prefetch: int = 4, epoch: int = 0):
        ds = _ordered(load_source(src, streaming, cache_dir), streaming, shuffle_buffer, seed, epoch)
        if skip:  # a state taken after the epoch's last document: Dataset.skip(len) would raise IndexError
            rows = getattr(ds, "num_rows", None)
            ds = ds.skip(skip) if rows is None or skip < rows else ds.select([])
        self.key, self.pool, self.prefetch, self.src = key, pool, prefetch, src
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
            self.pool.submit(self.key, text_values(batch["text"], self.src))

    def next_doc(self) -> np.ndarray | None:
        """The next document's tokens, or None when the source (this epoch) is exhausted."""
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

    def __init__(self, sources: list[Source], mix_by: str, max_tokens: int | None, state: dict | None = None,
                 on_source_end: str = "stop"):
        total = sum(s.weight for s in sources)
        n = len(sources)
        self.names = [s.key for s in sources]
        self.weights = [s.weight / total for s in sources]
        self.caps = [getattr(s, "max_tokens", None) for s in sources]
        self.max_epochs = [getattr(s, "max_epochs", 1) for s in sources]
        self.mix_by, self.max_tokens, self.on_end = mix_by, max_tokens, on_source_end
        st = state or {}
        self.docs = list(st.get("docs", [0] * n))
        self.tokens = list(st.get("tokens", [0] * n))
        self.epoch = list(st.get("epoch", [0] * n))            # the epoch being read (0-based)
        self.epoch_docs = list(st.get("epoch_docs", self.docs))  # documents consumed in it
        self.ended = list(st.get("ended", [False] * n))        # its last epoch was read to the end
        self.dropped = [tuple(d) if d else None for d in st.get("dropped", [None] * n)]  # (total tokens, why)
        self.ended_by: tuple[int, str] | None = None  # ``stop``: the source that ended the mixture, and how

    def state(self) -> dict:
        return {"docs": list(self.docs), "tokens": list(self.tokens), "epoch": list(self.epoch),
                "epoch_docs": list(self.epoch_docs), "ended": list(self.ended),
                "dropped": [list(d) if d else None for d in self.dropped]}

    def _drop(self, i: int, why: str) -> None:
        self.dropped[i] = (sum(self.tokens), why)

    def pick(self) -> int | None:
        """The source of the next document; None when the mixture is complete."""
        if self.max_tokens is not None and sum(self.tokens) >= self.max_tokens:
            return None
        for i, (cap, t) in enumerate(zip(self.caps, self.tokens)):
            if cap is not None and t >= cap and self.dropped[i] is None:
                if self.on_end == "stop":
                    self.ended_by = (i, f"reached its max_tokens {cap:,}")
                    return None
                self._drop(i, f"reached its max_tokens {cap:,}")
        live = [i for i in range(len(self.weights)) if self.dropped[i] is None]
        if not live:
            return None
        counts = self.tokens if self.mix_by == "tokens" else self.docs
        return min(live, key=lambda i: (counts[i] / self.weights[i], i))

    def source_ended(self, i: int) -> bool:
        """Source ``i``'s epoch ran out: True = read it again (its next epoch starts); False = it has ended
        (``stop``: the mixture ends; ``drop``: it leaves the mixture)."""
        if self.epoch[i] + 1 < self.max_epochs[i]:
            self.epoch[i] += 1
            self.epoch_docs[i] = 0
            return True
        self.ended[i] = True
        if self.on_end == "stop":
            self.ended_by = (i, "ran out")
        if self.on_end == "drop":
            self._drop(i, f"its {self.max_epochs[i]} epoch{'s' if self.max_epochs[i] > 1 else ''} were read")
        return False

    def took(self, i: int, n_tokens: int) -> None:
        """Source ``i``'s next row was read: ``n_tokens`` 0 is an empty row, which no share counts (nothing is
        written for it) and a resume still skips (``epoch_docs`` counts rows)."""
        self.epoch_docs[i] += 1
        if n_tokens:
            self.docs[i] += 1
            self.tokens[i] += n_tokens

    def report(self) -> dict:
        """Per source: documents, tokens, achieved share (of tokens and of documents), weight, epochs begun and
        completed, and when it left the mixture (``drop``)."""
        T, D = max(sum(self.tokens), 1), max(sum(self.docs), 1)
        out = {}
        for i, (n, d, t, w) in enumerate(zip(self.names, self.docs, self.tokens, self.weights)):
            out[n] = {"documents": d, "tokens": t, "token_share": round(t / T, 6), "document_share": round(d / D, 6),
                      "weight": round(w, 6), "epochs": self.epoch[i] + 1,
                      "epochs_completed": self.epoch[i] + int(self.ended[i])}
            if self.dropped[i]:
                out[n] |= {"dropped_at_tokens": self.dropped[i][0], "dropped_because": self.dropped[i][1]}
        return out
