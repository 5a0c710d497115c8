#!/usr/bin/env python
"""Training loader throughput on ONE core (issue 21: >= 50M tokens/s from shards).

    python scripts/loader_throughput.py [--tokens 200_000_000] [--seq_length 1024] [--micro 16]

Writes a synthetic uint16 shard set (random tokens: the loader never looks at values) into a temp
dir, then times `WindowLoader` (num_workers=0, so one process, pinned to one core when possible)
in both output modes: int64 (x, y) and packed (B, T + 1) uint16. Prints tokens/s of each.
"""
import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from yxanul.data.loader import WindowLoader
from yxanul.data.shards import write_shard


def make_data(root: Path, tokens: int, shard_size: int = 50_000_000) -> Path:
    rng = np.random.default_rng(0)
    names, left, i = [], tokens, 0
    while left > 0:
        n = min(shard_size, left)
        write_shard(root / f"train_{i:05d}.bin", rng.integers(0, 50257, n, dtype=np.uint16))
        names.append(f"train_{i:05d}.bin")
        left, i = left - n, i + 1
    write_shard(root / "val_00000.bin", rng.integers(0, 50257, 100_000, dtype=np.uint16))
    meta = {"vocab_size": 50257, "splits": {"train": {"shards": names, "tokens": tokens},
                                            "val": {"shards": ["val_00000.bin"], "tokens": 100_000}}}
    (root / "meta.json").write_text(json.dumps(meta))
    return root


def measure(data: Path, T: int, B: int, packed: bool, seconds: float) -> float:
    it = iter(WindowLoader(data, "train", T, B, seed=0, packed=packed))
    next(it)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        next(it)
        n += 1
    return n * B * T / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=200_000_000)
    ap.add_argument("--seq_length", type=int, default=1024)
    ap.add_argument("--micro", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        data = make_data(Path(d), args.tokens)
        for packed in (False, True):
            tps = measure(data, args.seq_length, args.micro, packed, args.seconds)
            print(f"{'packed (B, T+1) uint16' if packed else 'int64 (x, y)':<24} T={args.seq_length} B={args.micro}: "
                  f"{tps / 1e6:,.1f}M tokens/s on one core")


if __name__ == "__main__":
    main()
