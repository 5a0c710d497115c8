"""Checkpoint manifests and verification: is this checkpoint whole and unchanged since it was saved?

``manifest.json`` (written LAST, atomically, before the folder is committed and ``latest`` moves)::

    {"format": 2, "chunk_bytes": 67108864,
     "files": {"model.safetensors": {"size": N, "sha256_chunks": ["...", ...]}, ...},
     "bytes": total, "hash_seconds": t}

It lists every file of the checkpoint: its size and the sha256 of each ``chunk_bytes`` chunk of it (an
empty file: one, of nothing). :func:`verify_checkpoint` re-reads them before anything uses the checkpoint
(resume, ``init_from``, export) and returns what is wrong, one short phrase per problem; an empty list means
it verifies. Format 1 (a whole-file ``sha256`` per file) still verifies. A checkpoint written before
manifests existed (no ``manifest.json``) gets the checks that need no manifest: its state file parses and
holds ``step`` and ``data``, ``model.safetensors`` has a readable safetensors header, the optimizer file is
not empty.

Why chunks: a save waits for its hashes and a resume for its verification, and one file holds most of the
bytes (the optimizer's: 12 GB of 20 at 1.5B parameters). A whole-file sha256 is one core's work (~2 GB/s
with SHA extensions), ~6 s there at each save and each resume; the chunks of every file hash in parallel on
every core the process may use (hashlib releases the GIL), so the time falls with the cores until the page
cache's bandwidth. On this project's 2-core CPU box, one core busy elsewhere: a 1.7 GB checkpoint in two files
(1.5 GB + 0.2 GB) hashed in 0.89 s whole-file, 0.50 s in chunks (``hash_seconds``); under load average ~13,
format 1 took 2.3 s for a 629 MB checkpoint at save and 2.6 s to verify. Each save stores its own ``hash_seconds``
(shown by ``yxanul checkpoints``), so the cost on any machine is on record.
Why not hash inside the writers ("while writing"): accelerate, safetensors and torch.save open their own
files; hashing them right after, while their pages are still cached, reads no disk and costs the same CPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MANIFEST = "manifest.json"
STATE_FILE = "trainer_state.json"
PROVENANCE = "trained_on.json"  # training/provenance.py's; no yxanul wrote it without a manifest beside it
FORMAT = 2
CHUNK_BYTES = 64 << 20
MAX_HASH_THREADS = 16  # past this the page cache's bandwidth, not the cores, bounds sha256
STEP_NAME = re.compile(r"^step_[0-9]+$")


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _chunk_sha256(path: Path, offset: int, length: int) -> str:
    h, buf = hashlib.sha256(), bytearray(1 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        while length > 0:
            n = f.readinto(view[:min(len(buf), length)])
            if not n:  # shorter than listed: the digest differs (the size is checked apart)
                break
            h.update(view[:n])
            length -= n
    return h.hexdigest()


def chunk_digests(files: list[Path], chunk_bytes: int) -> dict[Path, list[str]]:
    """The sha256 of every ``chunk_bytes`` chunk of every file (an empty file: one chunk), all chunks in
    parallel on the cores this process may use."""
    tasks = [(p, off) for p in files for off in range(0, max(p.stat().st_size, 1), chunk_bytes)]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=max(1, min(len(tasks), cores, MAX_HASH_THREADS))) as pool:
        digests = list(pool.map(lambda t: _chunk_sha256(t[0], t[1], chunk_bytes), tasks))
    out: dict[Path, list[str]] = {p: [] for p in files}
    for (p, _), d in zip(tasks, digests, strict=True):
        out[p].append(d)
    return out


def _files(ckpt: Path) -> list[Path]:
    """Every regular file of a checkpoint folder (recursively), the manifest and temp files aside."""
    return sorted(p for p in ckpt.rglob("*") if p.is_file() and p.name != MANIFEST and ".tmp" not in p.name)


def write_manifest(ckpt: str | os.PathLike, write_atomic) -> dict:
    """Hash every file of ``ckpt`` and write ``manifest.json`` with ``write_atomic(path, text)``."""
    ckpt = Path(ckpt)
    t0 = time.perf_counter()
    files = _files(ckpt)
    digests = chunk_digests(files, CHUNK_BYTES)
    entries = {str(p.relative_to(ckpt)): {"size": p.stat().st_size, "sha256_chunks": digests[p]} for p in files}
    manifest = {"format": FORMAT, "chunk_bytes": CHUNK_BYTES, "files": entries,
                "bytes": sum(e["size"] for e in entries.values()), "hash_seconds": round(time.perf_counter() - t0, 4)}
    write_atomic(ckpt / MANIFEST, json.dumps(manifest, indent=1))
    return manifest


def read_manifest(ckpt: str | os.PathLike) -> dict | None:
    p = Path(ckpt) / MANIFEST
    if not p.is_file():
        return None
    try:
        m = json.loads(p.read_text())
    except (OSError, ValueError):
        return {"broken": True}
    return m if isinstance(m, dict) and isinstance(m.get("files"), dict) else {"broken": True}


def has_manifest(ckpt: str | os.PathLike) -> bool:
    return (Path(ckpt) / MANIFEST).is_file()


def read_state_checked(ckpt: str | os.PathLike) -> tuple[dict | None, str | None]:
    """(state, None) or (None, what is wrong with ``trainer_state.json``)."""
    p = Path(ckpt) / STATE_FILE
    if not p.is_file():
        return None, f"{STATE_FILE} missing"
    try:
        state = json.loads(p.read_bytes().decode("utf-8"))
    except (OSError, ValueError):
        return None, f"{STATE_FILE} is not JSON"
    if not isinstance(state, dict) or isinstance(state.get("step"), bool) or not isinstance(state.get("step"), int):
        return None, f"{STATE_FILE} has no integer 'step'"
    if state["step"] < 0:
        return None, f"{STATE_FILE} has a negative 'step' ({state['step']})"
    if not isinstance(state.get("data"), dict):
        return None, f"{STATE_FILE} has no 'data' position"
    return state, None


def _safetensors_problem(path: Path) -> str | None:
    """A cheap structural check of a safetensors file: header length, JSON header, data size."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0] if size >= 8 else None
            if n is None or n > size - 8:
                return f"{path.name} is truncated"
            header = json.loads(f.read(n))
    except (OSError, ValueError, struct.error):
        return f"{path.name} has no readable safetensors header"
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
    if 8 + n + max(ends, default=0) != size:
        return f"{path.name} is truncated ({size:,} bytes, header says {8 + n + max(ends, default=0):,})"
    return None


def _legacy_problems(ckpt: Path) -> list[str]:
    problems = []
    models = sorted(ckpt.glob("model*.safetensors"))
    if not models and not any((ckpt / "pytorch_model").glob("*model_states.pt")):  # DeepSpeed's own layout
        problems.append("model.safetensors missing")
    problems += [p for p in map(_safetensors_problem, models) if p]
    for opt in ("optimizer.bin",):
        if (ckpt / opt).exists() and (ckpt / opt).stat().st_size == 0:
            problems.append(f"{opt} is empty")
        elif (ckpt / opt).exists() and not zipfile.is_zipfile(ckpt / opt):  # torch.save's format: a zip archive
            problems.append(f"{opt} is not a whole torch file (truncated?)")
    return problems


def verify_checkpoint(path: str | os.PathLike, *, state_only: bool = False, yxanul_state: bool = True) -> list[str]:
    """What is wrong with the checkpoint folder ``path`` ([] = it verifies). With a manifest every
    listed file must exist with its size and sha256; without one, the legacy checks (module doc).
    ``state_only``: the manifest's sizes but not the hashes (listings of many big checkpoints).
    ``yxanul_state`` False: a transformers.Trainer checkpoint (its own trainer_state.json schema)."""
    ckpt = Path(path)
    if not ckpt.is_dir():
        return ["not a directory"]
    _, problem = read_state_checked(ckpt) if yxanul_state else (None, None)
    problems = [problem] if problem else []
    manifest = read_manifest(ckpt)
    if manifest is None and (ckpt / PROVENANCE).is_file():  # saved with a manifest: it was deleted since
        return problems + [f"{MANIFEST} missing (this checkpoint was saved with one: {PROVENANCE} is here)"]
    if manifest is None:
        return problems + _legacy_problems(ckpt)
    if manifest.get("broken"):
        return problems + [f"{MANIFEST} is not valid"]
    to_hash = {}
    for name, entry in manifest["files"].items():
        f = ckpt / name
        if not f.is_file():
            problems.append(f"{name} missing")
        elif f.stat().st_size != entry.get("size"):
            problems.append(f"{name} has {f.stat().st_size:,} bytes, the manifest says {entry.get('size'):,}")
        elif not state_only:
            to_hash[f] = entry
    problems += [f"{f.relative_to(ckpt)} does not match its sha256 (changed or corrupted since the save)"
                 for f in _hash_mismatches(to_hash, manifest.get("chunk_bytes"))]
    if yxanul_state and not any(n.startswith(("model", "pytorch_model")) for n in manifest["files"]):  # DeepSpeed
        problems.append("the manifest lists no model weights")
    return list(dict.fromkeys(problems))  # a missing trainer_state.json: said by both checks, once


def _hash_mismatches(entries: dict[Path, dict], chunk_bytes) -> list[Path]:
    """The files whose digests differ from their manifest entries: chunked (format 2, all chunks in one parallel
    pass) or whole-file (format 1)."""
    chunked = [f for f, e in entries.items() if "sha256_chunks" in e]
    digests = chunk_digests(chunked, chunk_bytes) if chunked and isinstance(chunk_bytes, int) and chunk_bytes > 0 \
        else {}
    return [f for f, e in entries.items()
            if (digests.get(f) != e["sha256_chunks"] if "sha256_chunks" in e else _sha256(f) != e.get("sha256"))]


def checkpoint_bytes(ckpt: str | os.PathLike) -> int:
    m = read_manifest(ckpt)
    if m and not m.get("broken") and isinstance(m.get("bytes"), int):
        return m["bytes"]
    return sum(p.stat().st_size for p in Path(ckpt).rglob("*") if p.is_file())
