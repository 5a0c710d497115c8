"""One writer per run (or sweep) directory, and checkpoints that cannot be pruned under a reader.

Writer lock: ``DIR/.yxanul.lock``, an exclusive ``fcntl.flock`` taken without waiting and held for the
whole run by the one process that writes (global rank 0). The kernel drops it when that process
ends, however it ends (kill -9 included), so a lock is never stale; the file itself stays and only
says who held it last (pid, host, command) for the refusal message. The file is not deleted (unlinking a
flock file lets two processes lock two different files of the same name), except with the folder the lock
itself created when nothing else was ever written there (a run refused before it wrote anything:
``release(remove_unused=True)``), so a mistyped flag leaves no empty run directory behind.

Reader pin: a shared ``flock`` on the checkpoint folder itself (a directory opens read-only, so
nothing is written into the checkpoint). Pruning takes the exclusive lock without waiting and skips
a pinned checkpoint (the next save prunes it). A reader that pins a folder that was pruned in the
meantime sees that it is gone and resolves again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
from pathlib import Path

from .errors import UserError

LOCK_FILE = ".yxanul.lock"


class DirLock:
    """The exclusive writer lock of a directory; `release()` (or the process's end) frees it."""

    def __init__(self, directory: str | os.PathLike, what: str = "run directory"):
        self.path = Path(directory) / LOCK_FILE
        folder = self.path.parent.absolute()
        self.made = [d for d in (folder, *folder.parents) if not d.exists()]  # only these may go (release), leaf first
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except FileNotFoundError as e:  # a folder mkdir -p cannot make (/proc, a virtual filesystem): one line
            raise UserError(f"{what} '{directory}': cannot be created ({e.strerror}); choose another") from None
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(self.fd)
            os.close(self.fd)
            self.fd = None
            raise UserError(f"{what} '{directory}' is in use by another yxanul process ({holder}); one writer per "
                            f"{what}: wait for it, stop it, or choose another directory") from None
        except OSError:  # a file system without flock (some network mounts): run unlocked, as before
            return
        me = {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.argv)[:300]}
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(me).encode() + b"\n", 0)

    def release(self, remove_unused: bool = False) -> None:
        """``remove_unused``: the folders this lock created too, if they hold nothing but the lock file
        (removed while still held: no other writer can have started in them)."""
        if self.fd is None:
            return
        if remove_unused and self.made:
            with contextlib.suppress(OSError):  # anything else in one (or gone): it and those above it stay
                if os.listdir(self.made[0]) == [LOCK_FILE]:
                    self.path.unlink()
                    for d in self.made:
                        d.rmdir()
        os.close(self.fd)  # closing the last descriptor releases the flock
        self.fd = None

    def __enter__(self) -> DirLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _holder(fd: int) -> str:
    try:
        d = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        return f"pid {d['pid']} on host {d['host']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"


def lock_on_main(directory, dist=None, what: str = "run directory") -> DirLock | None:
    """`DirLock` on the main process; with several processes its outcome is sent to every rank, so a
    refusal stops all of them with the same line instead of leaving the others at the next collective."""
    lock, error = None, None
    if dist is None or dist.is_main_process:
        try:
            lock = DirLock(directory, what)
        except UserError as e:
            error = str(e)
    if dist is not None and dist.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        error = broadcast_object_list([error], from_process=0)[0]  # sync point: every rank
    if error:
        raise UserError(error)
    return lock


@contextlib.contextmanager
def pinned(ckpt: str | os.PathLike):
    """Hold a shared lock on the checkpoint folder ``ckpt`` while reading it. Yields True when pinned,
    False when the folder is gone (pruned since it was chosen: resolve again)."""
    try:
        fd = os.open(ckpt, os.O_RDONLY)
    except FileNotFoundError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while a pruner holds it (a rename and a delete)
        except OSError:
            pass  # no flock here: read unpinned
        try:
            same = os.stat(ckpt).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        yield same
    finally:
        os.close(fd)


def try_claim(ckpt: str | os.PathLike) -> int | None:
    """For the pruner: an exclusive lock on ``ckpt`` if no reader pins it (a descriptor to close after
    the deletion), else None. Without flock support: claimed."""
    fd = os.open(ckpt, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError:
        pass
    return fd
