"""Token shard files: a 32-byte header then raw little-endian tokens, read back as a memmap.

Header: magic b"YXNL", format version (u32), dtype code (u32: 2 = uint16, 4 = uint32),
token count (u64), 12 bytes reserved.
"""

from __future__ import annotations

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
    if p.stat().st_size != expected:
        raise DataError(f"shard '{p}': truncated ({p.stat().st_size} bytes, expected {expected})")
    return np.memmap(p, dtype=np.dtype(_DTYPES[code]).newbyteorder("<"), mode="r", offset=HEADER, shape=(n,))


class ShardWriter:
    """Accumulates tokens and writes ``{prefix}_{i:05d}.bin`` shards of ``shard_size`` tokens."""

    def __init__(self, out_dir: Path, prefix: str, dtype, shard_size: int):
        self.out_dir, self.prefix, self.dtype, self.shard_size = out_dir, prefix, dtype, shard_size
        self.buf: list[np.ndarray] = []
        self.buffered = 0
        self.files: list[str] = []
        self.tokens = 0
        self.documents = 0

    def add(self, ids: list[int]) -> None:
        self.buf.append(np.asarray(ids, dtype=self.dtype))
        self.buffered += len(ids)
        self.tokens += len(ids)
        self.documents += 1
        if self.buffered >= self.shard_size:
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        if not self.buf:
            return
        data = np.concatenate(self.buf)
        while data.size >= self.shard_size or (final and data.size):
            chunk, data = data[: self.shard_size], data[self.shard_size:]
            name = f"{self.prefix}_{len(self.files):05d}.bin"
            write_shard(self.out_dir / name, chunk)
            self.files.append(name)
        self.buf, self.buffered = ([data] if data.size else []), int(data.size)

    def close(self) -> dict:
        self._flush(final=True)
        return {"tokens": self.tokens, "documents": self.documents, "shards": self.files}
