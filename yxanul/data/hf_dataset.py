"""yxanul's prepared shards as a `torch.utils.data.Dataset` / `datasets.Dataset` for `transformers.Trainer`.

Item ``i`` is one fixed-length window of ``seq_length + 1`` tokens, cut exactly as `WindowLoader` cuts
them (stride ``seq_length``, never across shards), returned as ``input_ids`` = the first ``seq_length``
tokens and the targets (see ``targets``). With ``seed`` set, the order of the items IS
`WindowLoader`'s: item ``i`` is window ``i`` of the loader's ``(seed, epoch)`` permutation (the same
code computes it). Each epoch is laid out as the loader lays it out for the run's batch:
``micro_batch_size`` B, ``world_size`` W and ``accumulation`` A (Trainer's per-device batch, processes and
gradient accumulation steps) make an epoch a whole number of optimizer steps, its last
``n % (B x W x A)`` windows dropped, the next epoch starting at its window 0. So with ``TrainingArguments(
train_sampling_strategy="sequential", seed=<same>)`` and the same B, W, A the Trainer sees the batches
`yxanul train` sees, epoch after epoch (one process: batch k = items [kB, (k+1)B); several: accelerate
hands process r batch r of every W, the loader's slice r of each step). The defaults (1, 1, 1) drop
nothing. ``seed=None`` keeps file order, every window of every epoch (Trainer's own RandomSampler then
shuffles; fine, deterministic under ``TrainingArguments.seed``/``data_seed``): the batch does not apply.

``targets``:
- ``"shift_labels"`` (default): ``shift_labels`` = the next token of every position (the loader's y):
  ``seq_length`` supervised positions per window, the loss of `yxanul train`. Trainer passes it (its
  default ``label_names`` are every forward argument named like ``*labels``) and counts it for
  ``num_items_in_batch``.
- ``"labels"``: the HF convention ``labels = input_ids`` (the model shifts), ``seq_length - 1``
  supervised positions: what an HF causal-LM recipe expects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import torch

from ..errors import ConfigError
from .loader import _BatchDataset, _Windows

TARGETS = ("shift_labels", "labels")


class ShardWindowDataset(torch.utils.data.Dataset):
    """Fixed-length windows of a prepared ``data_dir`` split; deterministic (a pure function of the index)."""

    def __init__(self, data_dir, seq_length: int, split: str = "train", seed: int | None = 0, epochs: int = 1,
                 targets: Literal["shift_labels", "labels"] = "shift_labels", *, micro_batch_size: int = 1,
                 world_size: int = 1, accumulation: int = 1):
        if isinstance(seq_length, bool) or not isinstance(seq_length, int) or seq_length < 2:
            raise ConfigError("seq_length", "an integer >= 2", seq_length)
        for key, v in (("epochs", epochs), ("micro_batch_size", micro_batch_size), ("world_size", world_size),
                       ("accumulation", accumulation)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(key, "an integer >= 1", v)
        if targets not in TARGETS:
            raise ConfigError("targets", " or ".join(TARGETS), targets)
        self.windows = _Windows(data_dir, split, seq_length)  # DataError for a missing/too small split
        self.seq_length, self.seed, self.epochs, self.targets = seq_length, seed, epochs, targets
        # WindowLoader's own layout and permutation, one micro-step of all ranks (B x W windows) at a time:
        # reused, not re-implemented, so the orders match (epochs end where the loader's end)
        self._order = (_BatchDataset(self.windows, seed, 0, 0, micro_batch_size * world_size, 0, 1,
                                     accumulation=accumulation) if seed is not None else None)

    @property
    def windows_per_epoch(self) -> int:
        if self._order is None:
            return self.windows.n
        return self._order.steps_per_epoch * self._order.per_step

    def __len__(self) -> int:
        return self.windows_per_epoch * self.epochs

    def window(self, i: int) -> torch.Tensor:
        """Window ``i`` as a (seq_length + 1,) int64 tensor."""
        import numpy as np

        if not 0 <= i < len(self):
            raise IndexError(f"window {i} out of range (dataset of {len(self)})")
        if self._order is None:
            return torch.from_numpy(self.windows.gather(np.array([i % self.windows.n])))[0]  # (T + 1,)
        step, j = divmod(i, self._order.per_step)
        epoch, pos = self._order.locate(step)                   # the loader's micro-step ``step``
        idx = int(self._order.perm(epoch)[pos + j])              # chunk = window: no base_length here
        return torch.from_numpy(self.windows.gather(np.array([idx])))[0]  # (T + 1,)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        win = self.window(int(i))                                   # (T + 1,)
        x = win[:-1]                                                # (T,)
        if self.targets == "labels":
            return {"input_ids": x, "labels": x.clone()}
        return {"input_ids": x, "shift_labels": win[1:]}            # (T,), (T,)


def to_hf_dataset(data_dir, seq_length: int, split: str = "train", seed: int | None = 0, epochs: int = 1,
                  targets: Literal["shift_labels", "labels"] = "shift_labels", cache_dir: str | None = None, *,
                  micro_batch_size: int = 1, world_size: int = 1, accumulation: int = 1):
    """The same windows, in the same order, as a `datasets.Dataset` (Arrow, torch format) for code that
    wants one (``.map``, ``.select``, ``push_to_hub``). It materialises every token once more on disk
    (Arrow cache; ``cache_dir`` picks where): for large corpora prefer `ShardWindowDataset` (memmap, no copy)."""
    import datasets

    batch = {"micro_batch_size": micro_batch_size, "world_size": world_size, "accumulation": accumulation}
    ds = ShardWindowDataset(data_dir, seq_length, split, seed, epochs, targets, **batch)
    column = "labels" if targets == "labels" else "shift_labels"
    meta = json.loads((Path(data_dir) / "meta.json").read_text())  # its fingerprint keys the Arrow cache
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int64"), length=seq_length),
                                  column: datasets.Sequence(datasets.Value("int64"), length=seq_length)})
    out = datasets.Dataset.from_generator(
        _rows, features=features, cache_dir=cache_dir,
        gen_kwargs={"data_dir": str(data_dir), "seq_length": seq_length, "split": split, "seed": seed,
                    "epochs": epochs, "targets": targets, "n": len(ds),
                    "fingerprint": meta.get("fingerprint"), "batch": batch})
    return out.with_format("torch")


def _rows(data_dir, seq_length, split, seed, epochs, targets, n, fingerprint=None, batch=None):
    """Generator for `datasets.Dataset.from_generator` (its arguments are part of the cache fingerprint)."""
    ds = ShardWindowDataset(data_dir, seq_length, split, seed, epochs, targets, **(batch or {}))
    for i in range(n):
        yield {k: v.tolist() for k, v in ds[i].items()}
