"""Token shard files: a 32-byte header then raw little-endian tokens, read back as a memmap.

Header: magic b"YXNL", format version (u32), dtype code (u32: 2 = uint16, 4 = uint32),
token count (u64), 12 bytes reserved.
"""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

import numpy as np

from ..errors import DataError

MAGIC, VERSION, HEADER = b"YXNL", 1, 32
_DTYPES = {2: np.uint16, 4: np.uint32}


def dtype_for_vocab(vocab_size: int):
    return np.uint16 if vocab_size <= 65536 else np.uint32


def write_shard(path: str | os.PathLike, tokens: np.ndarray) -> None:
    tokens = np.ascontiguousarray(tokens)
    code = {np.dtype(np.uint16): 2, np.dtype(np.uint32): 4}[tokens.dtype]
    with open(path, "wb") as f:
        f.write(struct.pack("<4sIIQ12x", MAGIC, VERSION, code, tokens.size))
        f.write(tokens.astype(tokens.dtype.newbyteorder("<"), copy=False).tobytes())


def open_shard(path: str | os.PathLike) -> np.memmap:
    """Read-only memmap of a shard's tokens (no copy)."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            head = f.read(HEADER)
    except FileNotFoundError:
        raise DataError(f"shard '{p}': no such file (re-run `yxanul prepare`)") from None
    if len(head) < HEADER or head[:4] != MAGIC:
        raise DataError(f"shard '{p}': not a yxanul token shard (bad header)")
    _, version, code, n = struct.unpack("<4sIIQ12x", head)
    if version != VERSION or code not in _DTYPES:
        raise DataError(f"shard '{p}': unsupported format version {version} / dtype code {code}")
    expected = HEADER + n * code
    size = p.stat().st_size
    if size != expected:  # longer: a shard being written (its count is filled in last) or appended to
        what = "truncated" if size < expected else "longer than its header says (an unfinished or damaged shard)"
        raise DataError(f"shard '{p}': {what} ({size} bytes, expected {expected})")
    return np.memmap(p, dtype=np.dtype(_DTYPES[code]).newbyteorder("<"), mode="r", offset=HEADER, shape=(n,))


class ShardWriter:
    """Streams documents into ``{prefix}_{i:05d}.bin`` shards of exactly ``shard_size`` tokens (the last
    one shorter), hashing each shard's token bytes while writing, and resumes from :meth:`state`.

    A shard is written in place; its header's token count is filled in when it is complete. The
    manifest entry of a complete shard: file, tokens, documents (EOS tokens in it, i.e. documents that
    end in it), tokens per source, sha256 of its token bytes (after the 32-byte header), the largest token
    id in it (``max_id``: checked against the model's vocabulary before step 1, verify.py).
    ``state()`` (after ``flush()``) + the files on disk are enough to continue exactly: the current
    shard is truncated back to the recorded length and later files are removed."""

    def __init__(self, out_dir: Path, prefix: str, dtype, shard_size: int, eos: int, state: dict | None = None):
        self.out_dir, self.prefix, self.dtype = Path(out_dir), prefix, np.dtype(dtype)
        self.shard_size, self.eos = shard_size, eos
        st = state or {}
        self.entries: list[dict] = list(st.get("entries", []))
        self.tokens, self.documents = int(st.get("tokens", 0)), int(st.get("documents", 0))
        self._cur = {"tokens": 0, "documents": 0, "sources": {}, "max_id": 0} | dict(st.get("current", {}))
        self._cur["sources"] = dict(self._cur["sources"])
        self._f, self._hash = None, hashlib.sha256()
        self._reopen()

    def _path(self, i: int) -> Path:
        return self.out_dir / f"{self.prefix}_{i:05d}.bin"

    def _reopen(self) -> None:
        """Open the current shard at its recorded length (re-hashing what it holds); drop later files."""
        i, n = len(self.entries), self._cur["tokens"]
        for stale in self.out_dir.glob(f"{self.prefix}_*.bin"):
            if int(stale.stem.rsplit("_", 1)[1]) > i or (int(stale.stem.rsplit("_", 1)[1]) == i and not n):
                stale.unlink()
        if not n:
            return
        self._f = open(self._path(i), "r+b")
        self._f.truncate(HEADER + n * self.dtype.itemsize)
        self._f.seek(HEADER)
        left = n * self.dtype.itemsize
        while left:
            chunk = self._f.read(min(left, 64 << 20))
            if not chunk:
                raise DataError(f"shard '{self._path(i)}': shorter than its recorded progress; delete the folder")
            self._hash.update(chunk)
            top = int(np.frombuffer(chunk, self.dtype.newbyteorder("<")).max())
            self._cur["max_id"] = max(self._cur["max_id"], top)
            left -= len(chunk)

    def add(self, ids: np.ndarray, source: str = "") -> None:
        """One document's tokens, EOS included (a 1-D array of this writer's dtype)."""
        self.tokens += len(ids)
        self.documents += 1
        while len(ids):
            if self._f is None:
                self._f = open(self._path(len(self.entries)), "w+b")
                self._f.write(struct.pack("<4sIIQ12x", MAGIC, VERSION, self.dtype.itemsize, 0))
            room = self.shard_size - self._cur["tokens"]
            part, ids = ids[:room], ids[room:]
            data = part.astype(self.dtype.newbyteorder("<"), copy=False).tobytes()
            self._f.write(data)
            self._hash.update(data)
            self._cur["tokens"] += len(part)
            self._cur["sources"][source] = self._cur["sources"].get(source, 0) + len(part)
            if len(part):
                self._cur["max_id"] = max(self._cur["max_id"], int(part.max()))
            if not len(ids) and len(part) and part[-1] == self.eos:
                self._cur["documents"] += 1
            if self._cur["tokens"] == self.shard_size:
                self._finish()

    def _finish(self) -> None:
        i, f = len(self.entries), self._f
        f.seek(0)
        f.write(struct.pack("<4sIIQ12x", MAGIC, VERSION, self.dtype.itemsize, self._cur["tokens"]))
        f.close()
        self.entries.append({"file": self._path(i).name, "tokens": self._cur["tokens"],
                             "documents": self._cur["documents"], "sources": self._cur["sources"],
                             "sha256": self._hash.hexdigest(), "max_id": self._cur["max_id"]})
        self._f, self._hash = None, hashlib.sha256()
        self._cur = {"tokens": 0, "documents": 0, "sources": {}, "max_id": 0}

    @property
    def shards_done(self) -> int:
        return len(self.entries)

    def flush(self) -> None:
        if self._f is not None:
            self._f.flush()

    def state(self) -> dict:
        return {"entries": list(self.entries), "tokens": self.tokens, "documents": self.documents,
                "current": {"tokens": self._cur["tokens"], "documents": self._cur["documents"],
                            "sources": dict(self._cur["sources"]), "max_id": self._cur["max_id"],
                            "sha256": self._hash.copy().hexdigest()}}

    def close(self) -> dict:
        if self._f is not None:
            self._finish()
        return {"tokens": self.tokens, "documents": self.documents,
                "shards": [e["file"] for e in self.entries], "manifest": self.entries}


def resume_problem(out_dir: Path, prefix: str, state: dict) -> str | None:
    """What no longer matches ``state`` (a `ShardWriter.state` saved by an interrupted prepare) among the shards
    in ``out_dir``: a finished shard's length or sha256, or the written part of the current one (a disk error,
    a file edited or truncated before the restart); None: resuming writes what an uninterrupted run would."""
    files = [(out_dir / e["file"], e["tokens"], e.get("sha256")) for e in state.get("entries", [])]
    cur = state.get("current", {})
    if cur.get("tokens"):
        files.append((out_dir / f"{prefix}_{len(files):05d}.bin", cur["tokens"], cur.get("sha256")))
    for path, tokens, digest in files:
        try:
            with open(path, "rb") as f:
                itemsize = struct.unpack("<4sIIQ12x", f.read(HEADER))[2]
                left, h = tokens * itemsize, hashlib.sha256()
                while left and (chunk := f.read(min(left, 64 << 20))):
                    h.update(chunk)
                    left -= len(chunk)
        except (OSError, struct.error) as e:
            return f"'{path}' ({e.strerror if isinstance(e, OSError) else 'no header'})"
        if left:
            return f"'{path}' (shorter than written)"
        if digest is not None and h.hexdigest() != digest:
            return f"'{path}' (its tokens changed since they were written)"
    return None
