"""Which checkpoint a resume or a reader (init_from, export, generate, eval, push) gets: the committed
checkpoints of a run listed, each verified against its manifest before use and pinned while in use. A damaged
``latest`` falls back to the newest checkpoint that verifies, with one line; a checkpoint named explicitly is
never swapped for another."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..run_lock import pinned
from .args import RUN_DIR_RESUMES
from .manifest import MANIFEST, STATE_FILE, STEP_NAME, has_manifest, read_state_checked, verify_checkpoint
from .pointers import checkpoints_dir, followed, pointer_name, read_pointer


def _step_of(name: str) -> int | None:
    name = name[len(".old-"):] if name.startswith(".old-") else name
    return int(name[5:]) if STEP_NAME.match(name) else None


def list_checkpoints(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Every committed checkpoint folder (``step_N``; an ``.old-step_N`` whose replacement never
    completed), sorted by step: its trainer_state.json plus ``path``, or, when that file is not a
    valid state, ``step`` (from the name), ``path`` and ``state_problem``. Folders being written
    (``.tmp-*``) or deleted (``.del-*``) are never listed."""
    root = checkpoints_dir(run_dir)
    out = []
    if not root.is_dir():
        return out
    for d in root.iterdir():
        step = _step_of(d.name)
        try:
            if step is None or not d.is_dir() or not any(d.iterdir()):
                continue
        except FileNotFoundError:  # pruned between the listing and the look inside
            continue
        if d.name.startswith(".old-") and (root / d.name[len(".old-"):] / STATE_FILE).is_file():
            continue  # the replacement is whole: the old copy is garbage of a finished swap
        state, problem = read_state_checked(d)
        entry = dict(state) if state else {"state_problem": problem}
        entry.update(step=step, path=str(d))
        out.append(entry)
    return sorted(out, key=lambda s: (s["step"], s["path"].endswith(f"step_{s['step']}")))


def is_checkpoint_dir(p: Path) -> bool:
    """A checkpoint folder (named ``step_N``, or holding a trainer state or a manifest), not a run."""
    return p.is_dir() and (_step_of(p.name) is not None or (p / STATE_FILE).exists() or (p / MANIFEST).exists())


def is_hf_trainer_checkpoint(p: Path) -> bool:
    """transformers.Trainer's ``checkpoint-N`` (config.json, and a trainer_state.json of its own: ``global_step``),
    which yxanul's Trainer callback gives a manifest too (integrations/hf_trainer.py)."""
    try:
        return (p / "config.json").is_file() and "global_step" in json.loads((p / STATE_FILE).read_text())
    except (OSError, ValueError, TypeError):
        return False


def _candidates(run_dir, prefer: tuple[str, ...]) -> list[Path]:
    """The checkpoints of a run in the order to try them: the ``prefer`` pointers, then the last saved first (by
    ``saved_at``, then step: a run that went back to an older checkpoint saves lower steps after the higher
    ones it left, and its fallback is its own newest, not theirs)."""
    root = checkpoints_dir(run_dir)
    # a pointer's folder is tried first even without its trainer state: its damage is then said, not skipped
    order = [read_pointer(run_dir, name) or (root / n if (n := pointer_name(run_dir, name)[0]) else None)
             for name in prefer]
    saved = sorted(list_checkpoints(run_dir), key=lambda c: (str(c.get("saved_at") or ""), c["step"]))
    order += [Path(c["path"]) for c in reversed(saved)]
    return list(dict.fromkeys(p for p in order if p is not None and p.is_dir()))


@contextlib.contextmanager
def verified_checkpoint(arg: str | os.PathLike, what: str = "MODEL", say: Callable[[str], None] | None = print,
                        prefer: tuple[str, ...] = ("best", "latest"), verb: str = "using", candidates=None,
                        yxanul_state: bool = True):
    """THE way every reader gets a checkpoint (resume, init_from, export, generate, eval, push): yields
    a checkpoint folder that verifies against its manifest (`verify_checkpoint`), pinned for the
    duration of the ``with`` block so that a running training cannot prune it (run_lock.py).

    ``arg`` a checkpoint folder: itself, or a one-line UserError naming what is wrong (a checkpoint
    named explicitly is never swapped for another). ``arg`` a run directory: the first of its
    ``prefer`` pointers, then of its checkpoints newest first, that verifies, with one line naming
    each one skipped and why; None when the run has no checkpoint; a UserError when none verifies.
    ``candidates``/``yxanul_state`` False: another layout's checkpoints, newest first (transformers.Trainer's)."""
    say = say or (lambda *_: None)
    p = Path(arg) if candidates is not None else followed(Path(arg))
    if candidates is None and is_checkpoint_dir(p):
        with pinned(p) as here:
            problems = (verify_checkpoint(p, yxanul_state=yxanul_state) if here
                        else ["deleted while it was being opened (pruned?)"])
            if problems:
                raise UserError(f"{what} '{arg}': damaged checkpoint ({'; '.join(problems)})")
            yield _noted(p, say)
        return
    for name in prefer:
        problem = pointer_name(p, name)[1]
        if problem:
            say(f"warning: {problem}; using the newest checkpoint that verifies")
    damaged = []
    for ckpt in _candidates(p, prefer) if candidates is None else candidates:
        with pinned(ckpt) as here:
            problems = verify_checkpoint(ckpt, yxanul_state=yxanul_state) if here else None
            if problems is None:  # pruned between the listing and the pin: the next one
                continue
            if problems:
                damaged.append(f"{ckpt.name} is damaged ({'; '.join(problems)})")
                continue
            if damaged:
                say(f"warning: {'; '.join(damaged)}: {verb} {ckpt.name}, the newest checkpoint that verifies")
            yield _noted(ckpt, say)
            return
    if damaged:
        raise UserError(f"no checkpoint under {checkpoints_dir(p) if candidates is None else p} verifies: "
                        + "; ".join(damaged))
    yield None


def latest_good_checkpoint(run_dir: str | os.PathLike, say: Callable[[str], None] | None = print) -> Path | None:
    """The checkpoint to resume a run from: the one ``latest`` names if it verifies, else the newest
    that verifies (`verified_checkpoint`)."""
    with verified_checkpoint(run_dir, "resume", say, prefer=("latest",), verb="resuming from") as ckpt:
        return ckpt


def resolve_resume(resume: str, run_dir: str | os.PathLike, say: Callable[[str], None] | None = print) -> Path | None:
    """'latest'/'auto' -> the checkpoint of run_dir to resume from (None if the run has none: for 'latest'
    `prepare_run_dir` has refused that already); a run directory -> the same for it; a checkpoint folder
    -> itself if it verifies (`verified_checkpoint`; a checkpoint named explicitly is never swapped for
    another). The writer lock of the run is held: nothing prunes it while it loads."""
    p = Path(run_dir) if resume in RUN_DIR_RESUMES else followed(Path(resume))
    if resume not in RUN_DIR_RESUMES and not is_checkpoint_dir(p) and not (
            (checkpoints_dir(p) / "latest").is_file() or list_checkpoints(p)):
        raise UserError(f"resume '{resume}': not a checkpoint (no {STATE_FILE}) nor a run directory with checkpoints")
    with verified_checkpoint(p, "resume", say, prefer=("latest",), verb="resuming from") as ckpt:
        return ckpt


def likely_resume(resume: str, run_dir: str | os.PathLike) -> Path | None:
    """The checkpoint a resume will most likely continue, found without verifying anything (`resolve_resume`
    verifies, and may fall back): the one named, else the run's ``latest``, else its newest. For checks that
    must come before the expensive work (what the run was trained on, before the data is prepared)."""
    p = Path(run_dir) if resume in RUN_DIR_RESUMES else followed(Path(resume))
    if is_checkpoint_dir(p):
        return p
    newest = list_checkpoints(p)
    return read_pointer(p, "latest") or (Path(newest[-1]["path"]) if newest else None)


def _noted(ckpt: Path, say) -> Path:
    if not has_manifest(ckpt):
        say(f"note: {ckpt} has no {MANIFEST} (saved by an older yxanul): loading it with basic checks only")
    return ckpt


def verified_weights_dir(path: str | os.PathLike, what: str = "init_from") -> Path:
    """For ``init_from``: a checkpoint folder must verify (`verified_checkpoint`), else a one-line
    UserError naming ``what``; other folders (save_pretrained, exports) pass as they are."""
    p = followed(Path(path))
    if is_checkpoint_dir(p):  # a transformers.Trainer checkpoint: its manifest, not yxanul's trainer state
        with verified_checkpoint(p, what, say=None, yxanul_state=not is_hf_trainer_checkpoint(p)):
            pass
    return p


def read_state(ckpt: str | os.PathLike) -> dict[str, Any]:
    state, problem = read_state_checked(ckpt)
    if problem:
        raise UserError(f"checkpoint '{ckpt}': {problem}")
    return state
