"""Checking a prepared folder's shards before training: each shard's sha256 against meta.json's manifest
and its largest token id against the model's vocabulary, so that a flipped bit or an id the embedding
does not have is one line naming the file before step 1 (not silent training, not an IndexError at the
first evaluation, not a device-side assert).

Hashing reads every byte once (~1 GB/s), so a shard that verified is remembered in ``verified.json``
in the folder by its size, mtime, ctime and inode: the next run start re-hashes only shards whose file changed.
The ctime is what no tool can set back (``touch -d``, ``os.utime`` and ``cp -p`` restore an mtime; any write
or utime moves the ctime), so a shard edited with its mtime kept is hashed again. A change no key sees (a bit
flipped on the disk itself) is still caught where it matters most: the loader checks each batch's ids against
the vocabulary (`loader._Windows.gather`).
A read-only folder is simply hashed at every start. A folder prepared by an older yxanul without
checksums is still used, with one line saying so; its ids are still checked (by a scan).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from ..errors import DataError
from .shards import HEADER, open_shard

CACHE = "verified.json"
CHUNK = 64 << 20


def _key(path: Path) -> list:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _scan(path: Path) -> tuple[str, int]:
    """(sha256 of the token bytes, largest token id) of one shard, read in chunks (bounded memory)."""
    dtype = open_shard(path).dtype  # also checks the header and the length
    h, top = hashlib.sha256(), 0
    with open(path, "rb") as f:
        f.seek(HEADER)
        while chunk := f.read(CHUNK):
            h.update(chunk)
            if len(chunk) >= dtype.itemsize:
                top = max(top, int(np.frombuffer(chunk, dtype).max()))
    return h.hexdigest(), top


def _read_cache(data_dir: Path) -> dict:
    try:
        return json.loads((data_dir / CACHE).read_text())
    except (OSError, ValueError):
        return {}


def record_verified(data_dir: Path, meta: dict) -> None:
    """Remember every shard of ``meta`` as verified (prepare calls it: it has just hashed them)."""
    cache = {e["file"]: {"key": _key(data_dir / e["file"]), "sha256": e.get("sha256"), "max_id": e.get("max_id")}
             for split in meta["splits"].values() for e in split.get("manifest", [])}
    _write_cache(data_dir, cache)


def _write_cache(data_dir: Path, cache: dict) -> None:
    tmp = data_dir / f".{CACHE}.tmp{os.getpid()}"
    try:
        tmp.write_text(json.dumps(cache))
        os.replace(tmp, data_dir / CACHE)
    except OSError:  # a read-only or full folder: verified again next time
        tmp.unlink(missing_ok=True) if tmp.parent.is_dir() else None


def verified(data_dir, say=print) -> Path:
    """``data_dir`` once its shards verified against its own vocabulary size (`verify_shards`)."""
    verify_shards(data_dir, int(json.loads((Path(data_dir) / "meta.json").read_text())["vocab_size"]), say)
    return Path(data_dir)


def verify_shards(data_dir, vocab_size: int, say=print) -> None:
    """Every shard of ``data_dir`` against its manifest entry and ``vocab_size``; a DataError naming the
    first bad file (delete the folder and prepare again). Shards unchanged since they verified are not
    read again."""
    d = Path(data_dir)
    meta = json.loads((d / "meta.json").read_text())
    cache, fresh, unchecked = _read_cache(d), {}, 0
    for split in meta["splits"].values():
        entries = split.get("manifest") or [{"file": f} for f in split["shards"]]
        for e in entries:
            path, unchecked = d / e["file"], unchecked + (e.get("sha256") is None)
            if not path.is_file():
                raise DataError(f"shard '{path}': missing (listed in {d / 'meta.json'}); delete {d} and prepare again")
            hit = cache.get(e["file"])
            if hit and hit["key"] == _key(path) and hit["sha256"] == e.get("sha256") and hit["max_id"] is not None:
                top = hit["max_id"]
            else:
                digest, top = _scan(path)
                if e.get("sha256") is not None and digest != e["sha256"]:
                    raise DataError(f"shard '{path}': its contents changed since `yxanul prepare` (sha256 {digest[:12]}"
                                    f"..., meta.json records {e['sha256'][:12]}...); delete {d} and prepare again")
            if top >= vocab_size:
                raise DataError(f"shard '{path}': holds token id {top}, outside the model's vocabulary of "
                                f"{vocab_size}; delete {d} and prepare again")
            fresh[e["file"]] = {"key": _key(path), "sha256": e.get("sha256"), "max_id": top}
    if unchecked:
        say(f"note: {d} was prepared by an older yxanul without shard checksums ({unchecked} shards): token ids "
            "checked only; prepare it again to have bit flips caught")
    if fresh != cache:
        _write_cache(d, fresh)
