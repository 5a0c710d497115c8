"""The resumable working folder of `yxanul prepare`: ``<out>.partial/``.

It holds the shards written so far, ``progress.json`` (the exact state after the last checkpoint,
written atomically) and, for non-streamed local sources, ``.datasets-cache/`` (datasets' Arrow copy of
the input). A process holds an exclusive ``flock`` on ``.lock`` while it works, so several processes
(nodes on a shared filesystem, threads) preparing the same folder take turns: the first one prepares,
the others find the finished folder. When complete the folder is renamed to ``<out>`` (atomic), so a
folder named ``<out>`` is always complete.

Cleaning: on failure the Arrow copy is removed at once; a kill -9 leaves it, and the next
`yxanul prepare` in the same parent folder removes it from every ``*.partial`` no process holds (the
written shards stay: they are what a restart resumes from) and removes the legacy ``<out>.tmp-*`` folders
older versions left for the same ``<out>`` (not resumable), and only when they hold nothing but what those
versions wrote there: any other folder with ``.tmp-`` in its name is the user's.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
from pathlib import Path

from ..errors import DataError

ARROW_CACHE = ".datasets-cache"
PROGRESS = "progress.json"
LOCK = ".lock"
# what older versions named their temporary output: ``<out>.tmp-<pid>`` or mkdtemp's ``<out>.tmp-XXXXXXXX``
_LEGACY_SUFFIX = re.compile(r"\.tmp-(\d+|[a-z0-9_]{8})")
# what they wrote in it: shards, meta, progress files, the tokenizer copy and datasets' Arrow copy
_LEGACY_FILE = re.compile(r"(train|val)_\d{5}\.bin|meta\.json|progress\.json(\.tmp)?")
_LEGACY_DIRS = ("tokenizer", ARROW_CACHE)


def _locked_by_someone(folder: Path) -> bool:
    try:
        fd = os.open(folder / LOCK, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)  # closing releases a lock we took


def _is_legacy_tmp(p: Path, out_name: str | None) -> bool:
    """A temporary output folder an older version left for ``out_name``: its name and its contents both
    say so (a sibling like ``thesis.tmp-draft/`` holding the user's files must never go)."""
    if out_name is None or not p.name.startswith(out_name):
        return False
    if not _LEGACY_SUFFIX.fullmatch(p.name[len(out_name):]) or (p / LOCK).exists():
        return False
    try:
        entries = list(p.iterdir())
    except OSError:
        return False
    return all((e.name in _LEGACY_DIRS and e.is_dir() and not e.is_symlink())
               or (_LEGACY_FILE.fullmatch(e.name) and e.is_file() and not e.is_symlink()) for e in entries)


def clean_stale(parent: Path, keep: Path | None = None, out_name: str | None = None) -> list[Path]:
    """Remove Arrow copies left in unlocked ``*.partial`` folders and the legacy temporary folders of
    ``out_name`` (the output being prepared)."""
    removed = []
    if not parent.is_dir():
        return removed
    for p in parent.iterdir():
        if p == keep or not p.is_dir():
            continue
        if p.name.endswith(".partial") and (p / ARROW_CACHE).exists() and not _locked_by_someone(p):
            shutil.rmtree(p / ARROW_CACHE, ignore_errors=True)
            removed.append(p / ARROW_CACHE)
        elif _is_legacy_tmp(p, out_name):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


class WorkDir:
    def __init__(self, out: Path):
        self.out = Path(out)
        self.path = self.out.with_name(self.out.name + ".partial")
        self._fd: int | None = None

    @property
    def arrow_cache(self) -> Path:
        return self.path / ARROW_CACHE

    def acquire(self) -> None:
        """Block until this process holds the folder's lock (creating the folder if needed)."""
        while True:
            try:
                self.path.mkdir(parents=True, exist_ok=True)
            except FileExistsError:  # removed by a finishing process between mkdir's EEXIST and its own is_dir()
                if self.path.exists() and not self.path.is_dir():
                    raise DataError(f"data_dir '{self.out}': '{self.path}' exists and is not a folder") from None
                continue
            except OSError as e:  # a parent that is a file, a read-only or virtual filesystem: the user's path
                raise DataError(f"data_dir '{self.out}': cannot create '{self.path}' "
                                f"({e.strerror or type(e).__name__})") from None
            try:
                fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
            except FileNotFoundError:  # removed (renamed away) between mkdir and open: try again
                continue
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.stat(self.path / LOCK).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                return
            os.close(fd)  # the folder we waited on was finished or discarded meanwhile

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def progress(self, fingerprint: str) -> dict | None:
        try:
            state = json.loads((self.path / PROGRESS).read_text())
        except (OSError, ValueError):
            return None
        return state if state.get("fingerprint") == fingerprint else None

    def save(self, state: dict) -> None:
        tmp = self.path / (PROGRESS + ".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.path / PROGRESS)  # atomic: a kill leaves the old or the new state

    def reset(self) -> None:
        """Start over (no usable progress): every file but the lock goes."""
        for p in self.path.iterdir():
            if p.name != LOCK:
                shutil.rmtree(p) if p.is_dir() else p.unlink()

    def drop_arrow_cache(self) -> None:
        shutil.rmtree(self.arrow_cache, ignore_errors=True)

    def finish(self) -> None:
        """Rename the complete folder to ``out`` (bookkeeping files removed first), the held lock file with it:
        a process that arrives meanwhile waits on that lock, never creates a new one inside the folder being
        renamed (and packs into it); the lock file is removed from ``out`` last, still held."""
        self.drop_arrow_cache()
        for name in (PROGRESS, PROGRESS + ".tmp"):
            (self.path / name).unlink(missing_ok=True)
        if self.out.exists():
            self.out.rmdir()  # an empty folder the user created
        os.rename(self.path, self.out)
        (self.out / LOCK).unlink()
        self.release()

    def disk_full(self, shard_bytes: int):
        """The one line for a write that failed for space: the shards written so far stay for a restart."""
        free = shutil.disk_usage(self.path if self.path.exists() else self.out.parent).free
        return DataError(f"disk full: preparing into {self.path} needs at least {shard_bytes:,} bytes for its next "
                         f"shard, {free:,} free; the shards written so far stay: free space (or choose another "
                         "data_dir / YXANUL_CACHE) and run it again, it continues where it stopped")

    def discard(self) -> None:
        """Remove the whole folder (nothing worth resuming)."""
        (self.path / LOCK).unlink(missing_ok=True)
        shutil.rmtree(self.path, ignore_errors=True)
        self.release()
