"""The ``latest`` and ``best`` pointers of a run's ``checkpoints/`` folder. A pointer is a file holding
a checkpoint NAME inside that folder (``step_N``), never a path out of it, replaced atomically;
reading one gives the folder it names (or the ``.old-`` copy of an unfinished re-save) or a one-line
problem."""

from __future__ import annotations

import os
from pathlib import Path

from .checkpoint_io import _write_atomic
from .manifest import STATE_FILE, STEP_NAME, read_state_checked


def checkpoints_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints"


def _pointer_name(run_dir, name: str) -> tuple[str | None, str | None]:
    """(target folder name, None), (None, None) when there is no pointer file, or (None, problem).
    A pointer is a checkpoint NAME inside the run's checkpoints folder, never a path out of it."""
    p = checkpoints_dir(run_dir) / name
    if not p.is_file():
        return None, None
    try:
        target = p.read_bytes().decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None, f"'{name}' pointer is not text"
    if not STEP_NAME.match(target):
        return None, f"'{name}' pointer {target[:60]!r} is not a checkpoint name (step_N)"
    return target, None


def _pointer(run_dir, name: str) -> Path | None:
    target, _ = _pointer_name(run_dir, name)
    if target is None:
        return None
    for d in (checkpoints_dir(run_dir) / target, checkpoints_dir(run_dir) / f".old-{target}"):
        if (d / STATE_FILE).is_file():
            return d
    return None


def _update_best(run_dir, state, final: Path) -> None:
    """Point ``best`` at ``final`` if its val loss beats the current best's. A best without a val
    loss (re-saved without an eval), damaged or gone, is beaten by any val loss."""
    val = state.get("val_loss")
    if not isinstance(val, (int, float)) or val != val:
        return
    best = _pointer(run_dir, "best")
    theirs = read_state_checked(best)[0] if best is not None else None
    old = theirs.get("val_loss") if theirs else None
    if not isinstance(old, (int, float)) or old != old or val < old or best == final:
        _write_atomic(checkpoints_dir(run_dir) / "best", final.name + "\n")
