"""The ``latest`` and ``best`` pointers of a run's ``checkpoints/`` folder. A pointer is a file holding
a checkpoint NAME inside that folder (``step_N``), never a path out of it, replaced atomically;
reading one gives the folder it names (or the ``.old-`` copy of an unfinished re-save) or a one-line
problem."""

from __future__ import annotations

import math
import os
from pathlib import Path

from .io import write_atomic
from .manifest import STATE_FILE, STEP_NAME, read_state_checked


def checkpoints_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints"


def pointer_name(run_dir, name: str) -> tuple[str | None, str | None]:
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


def read_pointer(run_dir, name: str) -> Path | None:
    target, _ = pointer_name(run_dir, name)
    if target is None:
        return None
    for d in (checkpoints_dir(run_dir) / target, checkpoints_dir(run_dir) / f".old-{target}"):
        if (d / STATE_FILE).is_file():
            return d
    return None


def followed(path: Path) -> Path:
    """What a user pointing at a run's own files means: its ``checkpoints/latest`` or ``checkpoints/best`` pointer
    file -> the checkpoint it names, its ``checkpoints`` folder -> the run. Anything else as it is."""
    if path.name in ("latest", "best") and path.parent.name == "checkpoints" and path.is_file():
        return read_pointer(path.parent.parent, path.name) or path
    if path.name == "checkpoints" and path.is_dir() and not (path / STATE_FILE).is_file() \
            and not (path / "checkpoints").is_dir():  # not a run that happens to be called checkpoints
        return path.parent
    return path


def recompute_best(run_dir) -> Path | None:
    """Point ``best`` at the checkpoint with the lowest validation loss among those that exist now,
    read from their own trainer states (the older one on a tie); remove the pointer when none has a
    val loss. Called after every save and prune: a re-saved step can be worse than the copy it
    replaced, and only what is on disk can be exported."""
    root = checkpoints_dir(run_dir)
    found = []
    for d in root.iterdir() if root.is_dir() else ():
        if not STEP_NAME.match(d.name):
            continue
        state = read_state_checked(d)[0]
        val = state.get("val_loss") if state else None
        if isinstance(val, (int, float)) and not isinstance(val, bool) and math.isfinite(val):
            found.append((val, int(d.name[5:]), d))
    if not found:
        (root / "best").unlink(missing_ok=True)
        return None
    best = min(found, key=lambda f: f[:2])[2]
    if pointer_name(run_dir, "best")[0] != best.name:
        write_atomic(root / "best", best.name + "\n")
    return best
