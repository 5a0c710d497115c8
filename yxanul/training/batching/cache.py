"""Search results cached per (model shape, seq length, precision, GPU, world size, activation
checkpointing, optimizer, multiple) in RUN/batch_cache.json and the user cache
($YXANUL_CACHE/batch_cache.json, default ~/.cache/yxanul/batch_cache.json), so restarts don't re-probe.

The entry keeps the boundary (largest size that ran, smallest that didn't), so a different
``max_micro_batch_size`` or ``batch_safety_margin`` reuses it; only a search that stopped at a smaller
cap than asked now is redone.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from ...data.sources import cache_root
from .search import SearchResult, apply_margin

SHAPE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "tie_word_embeddings", "backend")


def device_name(device=None) -> str:
    """GPU name and its memory (MIG slices share the name), or "cpu"."""
    import torch

    if device is not None and torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return "cpu"
    p = torch.cuda.get_device_properties(device)
    return f"{p.name} {p.total_memory / 2**30:.0f}GiB"


def cache_fields(model_config, *, seq_length: int, precision: str, world_size: int, gradient_checkpointing: bool,
                 optimizer: str = "adamw", multiple: int = 1, device=None) -> dict:
    """Everything the largest micro-batch depends on, readable (stored next to the result)."""
    import torch

    shape = {k: getattr(model_config, k, None) for k in SHAPE_KEYS}
    return {"model_shape": hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:12],
            "shape": shape, "seq_length": seq_length, "precision": precision, "device": device_name(device),
            "world_size": world_size, "gradient_checkpointing": bool(gradient_checkpointing), "optimizer": optimizer,
            "multiple": multiple, "torch": torch.__version__.split("+")[0]}


def cache_key(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def user_cache_file() -> Path:
    return cache_root() / "batch_cache.json"


def cache_files(run_dir=None, user_cache: bool = True) -> list[Path]:
    files = [Path(run_dir) / "batch_cache.json"] if run_dir is not None else []
    return files + ([user_cache_file()] if user_cache else [])


def _read(f: Path) -> dict:
    try:
        data = json.loads(f.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def lookup(key: str, files: list[Path], max_size: int, safety_margin: float,
           multiple: int = 1) -> tuple[SearchResult, dict] | tuple[None, None]:
    """A cached result usable with this cap and margin (and its stored entry), or (None, None)."""
    for f in files:
        entry = _read(f).get(key)
        if not isinstance(entry, dict):
            continue
        try:
            cached = SearchResult.from_dict(entry)
        except (KeyError, TypeError, ValueError):
            continue
        cap = max_size // multiple * multiple
        if cached.smallest_fail is None and cached.largest_ok < cap:
            continue  # that search stopped at a smaller cap: the boundary is unknown up to ours
        if cached.largest_ok >= cap and (cached.smallest_fail is None or cached.smallest_fail > cap):
            largest, fail = cap, None  # our cap binds before memory does
        else:
            largest, fail = cached.largest_ok, cached.smallest_fail
        return SearchResult(apply_margin(largest, fail, safety_margin, multiple), largest, fail, cached.probes), entry
    return None, None


def store(key: str, fields: dict, result: SearchResult, files: list[Path], extra: dict | None = None) -> None:
    """Merge the entry into each file (atomic replace; an unwritable cache is skipped silently)."""
    entry = {**result.to_dict(), "fields": fields, "created": time.strftime("%Y-%m-%dT%H:%M:%S"), **(extra or {})}
    for f in files:
        _write(f, key, entry)


def _write(f: Path, key: str, entry: dict) -> None:
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        data = _read(f)
        data[key] = entry
        tmp = f.with_name(f"{f.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
        os.replace(tmp, f)
    except OSError:
        pass


def get_or_find(fields: dict, search: Callable[[], SearchResult], *, max_size: int, safety_margin: float,
                multiple: int = 1, run_dir=None, user_cache: bool = True, write: bool | tuple[bool, bool] = True,
                reduce_min: Callable[[int], int] | None = None,
                extra: Callable[[SearchResult], dict] | None = None) -> tuple[SearchResult, bool]:
    """``(result, from_cache)``: the cached search result for ``fields``, else ``search()`` (then
    stored when ``write``: pass ``write=accelerator.is_main_process``, or ``(is_main_process,
    is_local_main_process)``: the run dir's copy (shared) by global rank 0, the user cache (per node)
    by each node's local rank 0). With ``reduce_min`` all ranks probe unless every rank had a hit, and
    agree on the smallest cached micro-batch."""
    key, files = cache_key(fields), cache_files(run_dir, user_cache)
    write_run, write_user = write if isinstance(write, tuple) else (write, write)
    mine = [f for f, user in zip(files, [False] * (run_dir is not None) + [True] * user_cache)
            if (write_user if user else write_run)]
    hit, entry = lookup(key, files, max_size, safety_margin, multiple)
    everyone = bool(reduce_min(int(hit is not None))) if reduce_min is not None else hit is not None
    if everyone:
        if reduce_min is not None:
            hit.micro_batch, hit.largest_ok = reduce_min(hit.micro_batch), reduce_min(hit.largest_ok)
        if write_run and run_dir is not None and key not in _read(files[0]):  # keep a user-cache hit with the run
            _write(files[0], key, entry)
        return hit, True
    result = search()
    if mine:
        store(key, fields, result, mine, extra(result) if extra else None)
    return result, False
