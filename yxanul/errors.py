"""User-facing errors: one line, no traceback.

Anything a user can cause by a bad flag, file or config value raises a subclass of
:class:`UserError`; the CLI prints ``error: <message>`` on one line and exits with code 2.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import os
from pathlib import Path


class UserError(Exception):
    """A mistake in the user's input (flag, config key, file). Printed as one line, exit code 2."""

    exit_code = 2


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
PEER_LOST_EXIT_CODE = 4  # a rank whose collective failed because another process of the job is gone (not a bug)


class EveryRankError(UserError):
    """A user error every rank of a job finds alike, also after the process group exists (the run directory, the
    resume target: the same shared files): rank 0 prints it, the others exit quietly."""


def require(module: str, extra: str, what: str) -> None:
    """A command's optional dependency, checked before any work (``find_spec``: nothing is imported): one line
    naming the extra that installs it, instead of an ImportError from deep inside the command."""
    if importlib.util.find_spec(module) is None:
        raise UserError(f"{what} needs {module.replace('_', '-')}, which is not installed: pip install "
                        f"\"yxanul[{extra}]\" (in a clone: pip install -c constraints.txt -e \".[{extra}]\")")


def first_line(e: BaseException, default: str = "") -> str:
    """An exception's message cut to its first line: what a one-line error quotes of a library's error."""
    text = str(e).strip()
    return text.splitlines()[0] if text else default


@contextlib.contextmanager
def alike_on_every_rank():
    """Inside, a UserError is an `EveryRankError`: for checks that read only the config, the world size and shared
    files (the batch plan, the curriculum, what a resume was trained on), so that one line is printed per job."""
    try:
        yield
    except EveryRankError:
        raise
    except UserError as e:
        raise EveryRankError(str(e)) from None


class ConfigError(UserError):
    """A config key that is unknown or has a bad value."""

    def __init__(self, key: str, expected: str, got: object = None):
        self.key, self.expected, self.got = key, expected, got
        msg = f"config key '{key}': expected {expected}"
        if got is not None:
            msg += f", got {got!r}"
        super().__init__(msg)


def check_out_folder(key: str, out: str) -> None:
    """``--KEY DIR``, a folder a command fills, checked before its work (`yxanul tokenizer train --out`, `yxanul
    bench --out`): not a file, and where mkdir would start (the deepest part that exists) a folder this process
    may write, so that a long run does not end in an error that loses what it made."""
    p = Path(out).expanduser()
    if p.exists() and not p.is_dir():
        raise ConfigError(key, "a folder (it is an existing file)", out)
    probe = next(q for q in (p, *p.parents) if q.exists())  # the deepest part that exists: where mkdir starts
    if not probe.is_dir():
        raise ConfigError(key, f"a folder that can be created ('{probe}' is a file)", out)
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(key, f"a folder that can be written ('{probe}' is not writable)", out)


def make_out_folder(key: str, out: str) -> Path:
    """Create ``--KEY DIR`` before the work: what `check_out_folder` cannot see (a read-only or virtual
    filesystem such as /proc, running as root) fails here, in one line, not after the work."""
    p = Path(out).expanduser()
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(key, f"a folder that can be created ({e.strerror or type(e).__name__})", out) from None
    return p


class DataError(UserError):
    """A data file or directory that is missing, empty or unreadable."""


class TrainingDiverged(UserError):
    """The loss or the gradient norm became inf/nan: the run stops without saving over good checkpoints."""

    exit_code = 3


_NO_SPACE = ("No space left on device", "os error 28", "Disk quota exceeded", "os error 122")


def is_no_space(e: BaseException | None) -> bool:
    """A write that failed for lack of space: ENOSPC/EDQUOT, also when a library wraps it (safetensors'
    ``SafetensorError: ... No space left on device (os error 28)``) or chains it."""
    import errno

    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(s in str(e) for s in _NO_SPACE):
            return True
        e = e.__cause__ or e.__context__
    return False


def path_error_line(e: OSError) -> str | None:
    """One line for an OSError that a path the user chose explains (a full disk, a read-only or foreign folder,
    a file where a folder goes, a link to nowhere, e.g. an unmounted scratch filesystem); None: not one of those.
    The CLI prints it for any command; a command that writes a path of its own (a figure) leaves these to it."""
    if e.errno in DISK_FULL:
        where = f" writing '{e.filename}'" if e.filename else ""
        return (f"error: disk full{where} ({e.strerror}): free space or choose another --output_dir, then --resume "
                "latest")
    if not e.filename:
        return None
    fix = "choose another folder (e.g. --output_dir)"
    link = _dangling_link(str(e.filename))
    if link is not None and e.errno in (errno.EEXIST, errno.ENOENT):
        return (f"error: '{link}' is a symbolic link to '{os.readlink(link)}', which does not exist (a filesystem "
                f"that is not mounted?); mount it, fix the link or {fix}")
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):  # a read-only or foreign folder
        return f"error: '{e.filename}': {e.strerror}; check its permissions or {fix}"
    in_the_way = e.errno == errno.ENOTDIR or (e.errno == errno.EEXIST and os.path.isfile(e.filename))
    if in_the_way or e.errno == errno.EISDIR:  # a file where a folder goes, or the reverse
        what = "a file is in the way of a folder" if in_the_way else "a folder is in the way of a file"
        return f"error: '{e.filename}': {e.strerror} ({what}); move it or {fix}"
    return None


def _dangling_link(path: str) -> str | None:
    """The first part of ``path`` (itself or a parent) that is a symbolic link to nothing, else None."""
    parts = os.path.normpath(path).split(os.sep)
    for i in range(1, len(parts) + 1):
        part = os.sep.join(parts[:i]) or os.sep
        if os.path.islink(part) and not os.path.exists(part):
            return part
    return None
