"""`WindowLoader`: resumable, distributed sampling of (seq_length + 1)-token windows from shards.

Each shard of a split is cut into non-overlapping windows of ``seq_length + 1`` tokens with stride
``seq_length`` (the last token of a window is the first of the next; a shard's tail shorter than a
window is skipped). Window order is a permutation that is a pure function of ``(seed, epoch)``.
A GLOBAL position counts windows consumed in the epoch: one iteration consumes
``micro_batch_size × world_size`` windows and rank ``r`` takes slice ``r`` of them. So the batch at
any point is a pure function of (seed, epoch, position): resume is exact, and resuming with another
world size continues at the same global position. The state reflects batches actually handed to
the caller, not the ones DataLoader workers prefetched.

Curriculum (``base_length`` L, a multiple of seq_length T): the permutation is over chunks of L
tokens (windows of L + 1), and each chunk is read as its L/T consecutive sub-windows of T + 1. Every
stage of one curriculum thus walks the same order of the same tokens: a stage change continues at
the next whole chunk of the same epoch (at most one chunk skipped), so one pass over the data never
repeats tokens. With T == L this is exactly the plain window order.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import time
import weakref
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError
from .shards import open_shard

# a larger validation split, true wherever the data came from (`yxanul prepare` makes the split)
MORE_VAL = "prepare the data again with a larger val_fraction"


class _Windows:
    def __init__(self, data_dir, split: str, seq_length: int, base_length: int | None = None,
                 more_val: str = MORE_VAL):
        meta_path = Path(data_dir) / "meta.json"
        if not meta_path.is_file():
            raise DataError(f"data_dir '{data_dir}': no meta.json (run `yxanul prepare`)")
        meta = json.loads(meta_path.read_text())
        if split not in meta["splits"]:
            raise DataError(f"data_dir '{data_dir}': no '{split}' split (splits: {', '.join(meta['splits'])})")
        self.files = [Path(data_dir) / f for f in meta["splits"][split]["shards"]]
        self.T, self.split, self.data_dir = seq_length, split, data_dir
        self.vocab = meta.get("vocab_size")  # ids at or past it: a shard changed after it verified (`check_ids`)
        self.L = base_length if base_length and base_length % seq_length == 0 else seq_length  # chunk length
        self.r = self.L // self.T  # sub-windows per chunk
        self.shards = None  # opened lazily (per DataLoader worker)
        counts = []
        for f in self.files:
            n = open_shard(f).shape[0]
            counts.append(max(0, (n - 1) // self.L))
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)  # in chunks
        self.n_chunks = int(self.offsets[-1])
        self.n = self.n_chunks * self.r  # windows of T + 1
        tokens = meta["splits"][split]["tokens"]
        # windows never cross shards: each shard's tail (< L + 1 tokens) is not trained on
        self.lost_fraction = 1 - self.n_chunks * self.L / max(tokens, 1)
        if self.n == 0 and tokens > self.L:
            biggest = max(open_shard(f).shape[0] for f in self.files)
            raise DataError(f"data_dir '{data_dir}': its shards hold at most {biggest:,} tokens each, too few for "
                            f"one window of {self.L + 1}: prepare it again with a larger shard_size_tokens")
        if self.n == 0:
            name = "validation" if split == "val" else split
            raise DataError(f"{name} split has {tokens:,} tokens; need at least seq_length+1 = {seq_length + 1}: "
                            "lower seq_length" + (f" or {more_val}" if split == "val" else " or add data"))

    def gather(self, idx: np.ndarray, dtype=np.int64) -> np.ndarray:
        """Windows ``idx`` (sub-window k of chunk c is ``c * r + k``) as a (len(idx), T + 1) array of
        ``dtype`` (None: the shards' own uint16/uint32)."""
        if self.shards is None:
            self.shards = [open_shard(f) for f in self.files]
        chunk, k = np.divmod(idx, self.r)
        shard = np.searchsorted(self.offsets, chunk, side="right") - 1
        out = np.empty((len(idx), self.T + 1), dtype=dtype or self.shards[0].dtype.newbyteorder("="))
        cols = np.arange(self.T + 1)
        for s in np.unique(shard):
            rows = np.nonzero(shard == s)[0]
            starts = (chunk[rows] - self.offsets[s]) * self.L + k[rows] * self.T
            out[rows] = self.shards[s][starts[:, None] + cols]
        if self.vocab is not None and out.max() >= self.vocab:
            self.out_of_vocab(out, shard, (chunk - self.offsets[shard]) * self.L + k * self.T)
        return out

    def out_of_vocab(self, out: np.ndarray, shard: np.ndarray, starts: np.ndarray):
        """The DataError of the first id of ``out`` outside the vocabulary: its shard and token index. verify.py
        checked every shard at the start, but it trusts a file whose size, times and inode did not change;
        a shard edited after that check would otherwise be an IndexError in the embedding (or a device-side
        assert) mid-run. The max over a batch in `gather` costs microseconds, no device sync."""
        row, col = np.argwhere(out >= self.vocab)[0]
        raise DataError(f"shard '{self.files[shard[row]]}': token {int(starts[row]) + int(col):,} is id "
                        f"{int(out[row, col])}, outside the vocabulary of {self.vocab} (the file changed after it "
                        f"verified); delete {self.data_dir} and prepare again")


class _BatchDataset(torch.utils.data.Dataset):
    """Item k = this rank's k-th batch after the loader's start state (pure function of k)."""

    def __init__(self, windows: _Windows, seed, epoch0, pos0, B, rank, world, packed=False, accumulation=1):
        self.w, self.seed, self.epoch0, self.pos0, self.packed = windows, seed, epoch0, pos0, packed
        self.B, self.rank, self.world = B, rank, world
        self.per_step = B * world  # windows of one micro-step, all ranks
        if windows.n // self.per_step == 0:
            raise DataError(f"{windows.split} split has {windows.n} windows of seq_length+1 tokens; one step needs "
                            f"micro_batch_size x world_size = {self.per_step}: lower them or add data")
        # an epoch ends on an optimizer step: 1 process x accumulation A and A processes then read the same windows
        # in every step, across epochs too (a split smaller than one optimizer step: micro-steps, as without A)
        self.unit = self.per_step * (accumulation if windows.n >= self.per_step * accumulation else 1)
        self.steps_per_epoch = windows.n // self.unit * (self.unit // self.per_step)  # micro-steps
        self._perm_epoch, self._perm = None, None

    def __len__(self):
        return 2**62

    def locate(self, k: int) -> tuple[int, int]:
        first = max(0, (self.w.n - self.pos0) // self.unit * (self.unit // self.per_step))  # left in epoch0
        if k < first:
            return self.epoch0, self.pos0 + k * self.per_step
        k -= first
        return self.epoch0 + 1 + k // self.steps_per_epoch, (k % self.steps_per_epoch) * self.per_step

    def perm(self, epoch: int) -> np.ndarray:
        if self._perm_epoch != epoch:
            # = default_rng(...).permutation(n) (same shuffle), in int32 when it fits: half the memory
            n = self.w.n_chunks
            idx = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
            np.random.default_rng([self.seed, epoch]).shuffle(idx)
            self._perm = idx
            self._perm_epoch = epoch
        return self._perm

    def __getitem__(self, k):
        epoch, pos = self.locate(k)
        start = pos + self.rank * self.B
        chunk_pos, k = np.divmod(np.arange(start, start + self.B), self.w.r)
        idx = self.perm(epoch)[chunk_pos].astype(np.int64) * self.w.r + k
        if self.packed:
            return torch.from_numpy(self.w.gather(idx, dtype=None))  # (B, T + 1) uint16/uint32
        win = torch.from_numpy(self.w.gather(idx))
        return win[:, :-1], win[:, 1:]  # (B, T) inputs, (B, T) targets


class WindowLoader:
    def __init__(self, data_dir, split: str, seq_length: int, micro_batch_size: int, seed: int,
                 rank: int = 0, world_size: int = 1, num_workers: int = 0, pin_memory: bool = False,
                 base_length: int | None = None, packed: bool = False, accumulation: int = 1):
        if seq_length < 1 or micro_batch_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"WindowLoader: need seq_length >= 1, micro_batch_size >= 1, 0 <= rank < world_size; "
                             f"got {seq_length}, {micro_batch_size}, {rank}, {world_size}")
        self.windows = _Windows(data_dir, split, seq_length, base_length)
        self.seq_length, self.B, self.seed = seq_length, micro_batch_size, seed
        self.rank, self.world, self.num_workers, self.pin_memory = rank, world_size, num_workers, pin_memory
        self.packed = packed  # yield one (B, T + 1) token tensor (shard dtype) instead of int64 (x, y)
        self.accumulation = accumulation  # micro-steps of an optimizer step: epochs end on a whole one
        self._start = (0, 0)
        self._yielded = 0
        self._ds = self._dataset()

    def _dataset(self) -> _BatchDataset:
        return _BatchDataset(self.windows, self.seed, *self._start, self.B, self.rank, self.world, self.packed,
                             self.accumulation)

    @property
    def epoch(self) -> int:
        """The epoch of the next batch (what `state_dict` resumes at)."""
        return self._ds.locate(self._yielded)[0]

    @property
    def last_epoch(self) -> int:
        """The epoch of the last batch handed out: the one a step just trained on, which `epoch` is not after the
        last step of an epoch (before any batch of this loader: the next one's)."""
        return self._ds.locate(max(self._yielded - 1, 0))[0]

    def state_dict(self) -> dict:
        epoch, pos = self._ds.locate(self._yielded)
        return {"epoch": epoch, "position": pos, "seq_length": self.seq_length, "seed": self.seed,
                "base_length": self.windows.L, "micro_batch_size": self.B, "world_size": self.world}

    def load_state_dict(self, state: dict) -> None:
        T, epoch = int(state.get("seq_length", self.seq_length)), int(state.get("epoch", 0))
        same_order = state.get("seed", self.seed) == self.seed and int(state.get("base_length", T)) == self.windows.L
        if same_order and T == self.seq_length:
            self._start = (epoch, int(state["position"]))
        elif same_order:  # another stage of the same curriculum: go on at the next whole chunk
            chunks = -(-int(state["position"]) // (self.windows.L // T))
            pos = chunks * self.windows.r
            self._start = (epoch, pos) if pos < self.windows.n else (epoch + 1, 0)
        else:  # another window grid or order: positions don't carry over; start the next epoch afresh
            self._start = (epoch + 1, 0)
        self._yielded = 0
        self._ds = self._dataset()

    def __iter__(self):
        ds, start = self._ds, self._yielded
        sampler = _Count(start)
        # its own generator: each iterator draws a base seed (for worker seeds; the windows need none), which from
        # the global RNG would move the training's torch RNG once per epoch and per resume
        loader = torch.utils.data.DataLoader(ds, batch_size=None, sampler=sampler, num_workers=self.num_workers,
                                             generator=torch.Generator().manual_seed(self.seed),
                                             pin_memory=self.pin_memory, persistent_workers=False,
                                             worker_init_fn=_leave_stop_signals_to_the_main_process,
                                             prefetch_factor=4 if self.num_workers else None)
        it = iter(loader)
        if self.num_workers:
            _LIVE.add(it)
        try:
            for batch in it:
                self._yielded += 1
                yield batch
        except DataError:  # from a worker, torch puts its traceback in the message: build the batch here, one line
            if self.num_workers:
                self._ds[self._yielded]  # a pure function of its index
            raise
        finally:  # the generator is closed (or collected): its workers go now, never at exit
            _stop_workers(it)


def split_window(win: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A packed (B, T + 1) uint16/uint32 batch -> int64 (x, y) on ``device``: ONE small host->device
    copy per micro-step (2 bytes a token instead of 2 x 8), widened and sliced on the device."""
    w = win.to(device, non_blocking=True).long()  # (B, T + 1)
    return w[:, :-1], w[:, 1:]  # (B, T) inputs, (B, T) targets


def _leave_stop_signals_to_the_main_process(_worker_id: int) -> None:
    """torchrun (``os.killpg``) and SLURM signal the whole process group: a worker killed by SIGTERM
    would crash the run before the main process saves its checkpoint (training/preemption.py). Workers
    ignore SIGTERM/SIGUSR1/SIGINT/SIGHUP; the main process finishes the step, saves and shuts them down.

    Ignoring SIGTERM must never cost a hang: multiprocessing's exit handler stops workers with
    SIGTERM and then joins them without a timeout. So the main process stops its workers itself
    (`_stop_workers`: torch's shutdown, then SIGKILL after a bound) when an iteration ends, and at
    exit before multiprocessing's handler runs (`_kill_live_workers`, registered after it: atexit
    runs last-registered first); and a worker dies with its parent (PR_SET_PDEATHSIG on Linux; torch's
    own watchdog is the fallback elsewhere)."""
    for name in ("SIGTERM", "SIGUSR1", "SIGINT", "SIGHUP"):  # Ctrl-C and a hangup reach the whole group too
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    _die_with_parent()


def _die_with_parent() -> None:
    if sys.platform != "linux":
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the parent died before prctl: go now
        os._exit(0)


_LIVE: weakref.WeakSet = weakref.WeakSet()  # iterators of this process whose workers may be alive
STOP_TIMEOUT_S = 3.0


def _stop_workers(it) -> None:
    """torch's own shutdown (done event, join with a timeout, SIGTERM: ignored by our workers), then
    SIGKILL for any worker still alive after ``STOP_TIMEOUT_S``. Workers hold no state worth saving."""
    _LIVE.discard(it)
    workers = list(getattr(it, "_workers", []))
    if not workers:
        return
    try:
        it._shutdown_workers()  # private torch API; what `del it` would do, but now
    except Exception:  # noqa: BLE001 - a broken queue must not stop the kill below
        pass
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for w in workers:
        w.join(timeout=max(0.0, deadline - time.monotonic()))
        if w.is_alive():
            w.kill()
            w.join(timeout=1.0)


@atexit.register
def _kill_live_workers() -> None:
    for it in list(_LIVE):
        _stop_workers(it)


class _Count(torch.utils.data.Sampler):
    def __init__(self, start: int):
        self.start = start

    def __iter__(self):
        k = self.start
        while True:
            yield k
            k += 1


def repeats_warning(data_dir, max_steps: int, tokens_per_step: int) -> str | None:
    """One line when ``max_steps`` optimizer steps of ``tokens_per_step`` tokens need more than the prepared
    training tokens (the loader then loops over them: right for a demo on the bundled corpus, a silent waste
    at scale, e.g. a mixture that ended early); None when one pass is enough. The trainer prints it at start."""
    prepared = int(json.loads((Path(data_dir) / "meta.json").read_text())["splits"]["train"]["tokens"])
    needed = int(max_steps) * int(tokens_per_step)
    if needed <= prepared:
        return None
    return (f"warning: max_steps {max_steps:,} reads the prepared data {needed / max(prepared, 1):,.1f} times "
            f"({prepared:,} tokens prepared, {needed:,} needed): prepare more data or lower max_steps")


def eval_batches(data_dir, seq_length: int, micro_batch_size: int, max_batches: int, rank: int = 0,
                 world_size: int = 1, packed: bool = False, more_val: str = MORE_VAL):
    """Fixed validation batches (in order, no shuffling): the first ``max_batches`` of the split, all processes
    together, rounded down to a multiple of ``world_size`` (at least one each: every rank runs the same number of
    forwards, which FSDP's gathers need); rank r takes batches r, r+W, ... The same windows whatever the world
    size where ``max_batches`` divides by it: a resume at another world size compares like with like.
    ``packed``: one (B, T + 1) tensor of the shards' dtype per batch (`split_window`), else int64 (x, y).
    ``more_val``: how to get a larger split, in the errors of a split too small (the caller knows the data's
    origin)."""
    w = _Windows(data_dir, "val", seq_length, more_val=more_val)
    n_batches = max(world_size, min(max_batches, w.n // micro_batch_size) // world_size * world_size)
    if w.n // micro_batch_size < world_size:
        raise DataError(f"validation split has {w.n} windows of {seq_length + 1} tokens; evaluation needs "
                        f"micro_batch_size x world_size = {micro_batch_size * world_size}: lower micro_batch_size "
                        f"or {more_val}")
    for b in range(rank, n_batches - n_batches % world_size, world_size):
        win = torch.from_numpy(w.gather(np.arange(b * micro_batch_size, (b + 1) * micro_batch_size),
                                        dtype=None if packed else np.int64))
        yield win if packed else (win[:, :-1], win[:, 1:])
