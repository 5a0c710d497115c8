"""Checkpoints: ``RUN/checkpoints/step_N/`` written atomically, a ``latest`` pointer, best-by-val-loss
kept, the last ``keep_last`` kept, and a listing table.

Layout of one checkpoint (everything accelerate's ``save_state`` writes, plus ours)::

    step_N/
      model.safetensors, optimizer.bin, random_states_*.pkl   # accelerate.save_state
      trainer_state.json   # step, tokens_seen, epoch, data position, precision, backend, val_loss
      config.yaml          # the resolved config of the run that wrote it

Atomicity: every rank writes into ``.tmp-step_N``; after a barrier the main process writes
``trainer_state.json``, then ``manifest.json`` (names, sizes, sha256 of every file: manifest.py) last,
renames the folder to ``step_N`` (one ``rename`` on one file system), then replaces the ``latest``
pointer (a NAME inside checkpoints/, never a path) with ``os.replace``. A crash at any moment leaves
either the old checkpoint set or the new one. Re-saving a step moves the old copy to
``.old-step_N`` and deletes it only after the new one is in place. Pruning renames a folder to
``.del-step_N`` before deleting it. Before use (resume, init_from) a checkpoint is verified against
its manifest; a damaged ``latest`` falls back to the newest checkpoint that verifies, with one line.
A full disk removes the partial save and is one line naming the directory and the bytes needed.
The pointers live in pointers.py, the atomic writes and weight loading in io.py, the manifest in
manifest.py, the listing table in table.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, UserError, is_no_space
from ..run_lock import pinned, try_claim
from .io import fsync_dir, own_storage_for_views, write_atomic
from .manifest import (
    MANIFEST,
    STATE_FILE,
    STEP_NAME,
    checkpoint_bytes,
    has_manifest,
    read_state_checked,
    verify_checkpoint,
    write_manifest,
)
from .pointers import checkpoints_dir, pointer_name, read_pointer, recompute_best


@dataclass
class CheckpointArgs:
    """Run directory and checkpoints."""

    output_dir: str | None = field(
        default=None,
        metadata={"help": "Run directory: config, checkpoints, metrics.jsonl, TensorBoard events and "
                          "samples all live under it (default: runs/<run_name>)."})
    run_name: str | None = field(default=None, metadata={"help": "Name of the run (default: <model>-<date>-<time>)."})
    resume: str | None = field(
        default=None,
        metadata={"help": "Resume from 'latest' (the newest checkpoint under output_dir; an error if it has none), "
                          "'auto' (resume if output_dir holds a checkpoint, else start fresh: for requeued jobs and "
                          "restarted pods) or a checkpoint path."})
    list_checkpoints: bool = field(default=False, metadata={"help": "Print the checkpoints of output_dir and exit."})
    checkpoint_freq: int = field(default=250,
                                 metadata={"help": "Save a checkpoint every N optimizer steps (0: only at the end)."})
    keep_last: int = field(default=3,
                           metadata={"help": "Keep the newest N checkpoints (the best by val loss is always kept)."})
    save_final: bool = field(default=True, metadata={"help": "Save a checkpoint when training ends."})
    resume_allow_changes: list[str] | None = field(
        default=None,
        metadata={"help": "Resume although these differ from what the checkpoint was trained on (else one line, "
                          "exit 2): tokenizer, dataset, val_split, seq_length, seed, or all. What each change does "
                          "to the run is printed."})

    def __post_init__(self):
        allowed = ("tokenizer", "dataset", "val_split", "seq_length", "seed", "all")
        bad = [n for n in self.resume_allow_changes or () if n not in allowed]
        if bad:
            raise ConfigError("resume_allow_changes", f"names out of {', '.join(allowed)}", bad[0])
        if self.checkpoint_freq < 0:
            raise ConfigError("checkpoint_freq", "an integer >= 0", self.checkpoint_freq)
        if self.keep_last < 1:
            raise ConfigError("keep_last", "an integer >= 1", self.keep_last)


def _names(cfg) -> tuple[str, str]:
    """(run_name, output_dir) of a config: the given ones, else ``<model>-<timestamp>`` and
    ``runs/<run_name>``."""
    ck = cfg.checkpoint
    name = ck.run_name or f"{cfg.model.model}-{time.strftime('%Y%m%d-%H%M%S')}"
    return name, ck.output_dir or str(Path("runs") / name)


def run_dir_of(cfg) -> Path:
    """The run directory of a config: ``output_dir``, else ``runs/<run_name>`` (default name:
    ``<model>-<timestamp>``). Reads the config only (`prepare_run_dir` settles the names)."""
    return Path(_names(cfg)[1])


def prepare_run_dir(cfg, dist=None):
    """(run_dir, the checkpoint section with ``run_name``/``output_dir`` settled): `run_dir_of`, refusing
    what would lose or misplace work: ``resume: latest`` without a fixed run directory (the default name is
    new at every launch), an output_dir under a file, and a new run (no ``resume``) into a directory holding
    checkpoints, whose ``latest`` it would take over. The config is left as given: its owner (the trainer)
    records the settled names, so config.yaml and the trackers name the run directory used.
    ``dist`` (accelerate's PartialState): with several processes the default name is rank 0's, sent to
    every rank (each rank's own clock could straddle a second and split the run into two folders)."""
    ck = cfg.checkpoint
    if ck.resume in RUN_DIR_RESUMES and ck.output_dir is None and ck.run_name is None:
        raise UserError(f"resume '{ck.resume}': set --output_dir or --run_name too (the default run directory is "
                        "new at every launch)")
    # settle the names once, explicitly: config.yaml and the trackers record the run directory used
    names = _names(cfg)
    if dist is not None and dist.num_processes > 1 and ck.run_name is None:
        from accelerate.utils import broadcast_object_list

        names = tuple(broadcast_object_list([names], from_process=0)[0])  # sync point: every rank
    settled = dataclasses.replace(ck, **dict(zip(("run_name", "output_dir"), names)))
    run_dir = Path(settled.output_dir)
    existing = next(p for p in (run_dir, *run_dir.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise UserError(f"output_dir '{run_dir}': '{existing}' exists and is not a directory")
    _check_resume_target(ck.resume, run_dir)
    ckpts = [] if ck.resume else list_checkpoints(run_dir)
    if ckpts:
        raise UserError(f"output_dir '{run_dir}' already holds checkpoints (newest: step {ckpts[-1]['step']}): add "
                        "--resume latest to continue that run, or choose another --output_dir/--run_name")
    return run_dir, settled


RUN_DIR_RESUMES = ("latest", "auto")  # resume values naming the run directory's own newest checkpoint


def _check_resume_target(resume: str | None, run_dir: Path) -> None:
    """Before anything is built: ``latest`` with no checkpoint under the run directory, or a path that
    does not exist, is a mistyped directory, not a new run (``auto`` is the value that allows one)."""
    if resume == "latest" and not _has_checkpoints(run_dir):
        raise UserError(f"resume 'latest': no checkpoint under '{run_dir}' (a mistyped --output_dir/--run_name? "
                        "`--resume auto` resumes if there is one and starts fresh otherwise)")
    if resume not in (None, *RUN_DIR_RESUMES) and not Path(resume).exists():
        raise UserError(f"resume '{resume}': no such checkpoint or run directory")


def _has_checkpoints(run_dir: str | os.PathLike) -> bool:
    return (checkpoints_dir(run_dir) / "latest").is_file() or bool(list_checkpoints(run_dir))


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
        if step is None or not d.is_dir() or not any(d.iterdir()):
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


def _candidates(run_dir, prefer: tuple[str, ...]) -> list[Path]:
    """The checkpoints of a run in the order to try them: the ``prefer`` pointers, then newest first."""
    order = [read_pointer(run_dir, name) for name in prefer]
    order += [Path(c["path"]) for c in reversed(list_checkpoints(run_dir))]
    return list(dict.fromkeys(p for p in order if p is not None))


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
    p = Path(arg)
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
    p = Path(run_dir if resume in RUN_DIR_RESUMES else resume)
    if resume not in RUN_DIR_RESUMES and not is_checkpoint_dir(p) and not (
            (checkpoints_dir(p) / "latest").is_file() or list_checkpoints(p)):
        raise UserError(f"resume '{resume}': not a checkpoint (no {STATE_FILE}) nor a run directory with checkpoints")
    with verified_checkpoint(p, "resume", say, prefer=("latest",), verb="resuming from") as ckpt:
        return ckpt


def _noted(ckpt: Path, say) -> Path:
    if not has_manifest(ckpt):
        say(f"note: {ckpt} has no {MANIFEST} (saved by an older yxanul): loading it with basic checks only")
    return ckpt


def verified_weights_dir(path: str | os.PathLike, what: str = "init_from") -> Path:
    """For ``init_from``: a checkpoint folder must verify (`verified_checkpoint`), else a one-line
    UserError naming ``what``; other folders (save_pretrained, exports) pass as they are."""
    p = Path(path)
    if is_checkpoint_dir(p):
        with verified_checkpoint(p, what, say=None):
            pass
    return p


def read_state(ckpt: str | os.PathLike) -> dict[str, Any]:
    state, problem = read_state_checked(ckpt)
    if problem:
        raise UserError(f"checkpoint '{ckpt}': {problem}")
    return state


def _clean_leftovers(root: Path) -> None:
    """Before a save (main process): remove what a crash left behind, keeping whichever copy is whole."""
    for stale in [*root.glob(".tmp-step_*"), *root.glob(".del-step_*")]:  # a crashed save / prune
        shutil.rmtree(stale, ignore_errors=True)
    for old in root.glob(".old-step_*"):  # a crash while replacing a step
        whole = root / old.name[len(".old-"):]
        if (whole / MANIFEST).is_file() or (whole / STATE_FILE).is_file():
            shutil.rmtree(old, ignore_errors=True)
        else:
            shutil.rmtree(whole, ignore_errors=True)
            os.rename(old, whole)


LOW_SPACE = 64 << 20  # free bytes under which a failed write is taken for a full disk


def _need_bytes(root: Path, tmp: Path, step: int) -> tuple[int, int, list]:
    written = sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file()) if tmp.exists() else 0
    prev = [c for c in list_checkpoints(root.parent) if c["step"] != step]
    return written, max([written] + [checkpoint_bytes(c["path"]) for c in prev[-1:]]), prev


def _is_disk_full(e: Exception, root: Path, tmp: Path, step: int) -> bool:
    """ENOSPC/EDQUOT; or any write error while the file system is (nearly) full: torch.save reports
    ENOSPC as ``RuntimeError: basic_ios::clear: iostream error`` / ``unexpected pos`` (seen on tmpfs)."""
    if is_no_space(e):  # also safetensors' SafetensorError, which wraps the OS error in its message
        return True
    if not isinstance(e, (OSError, RuntimeError)):
        return False
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return False
    written, need, _ = _need_bytes(root, tmp, step)
    return free < LOW_SPACE or free + written < need


def _disk_full(root: Path, tmp: Path, step: int) -> UserError:
    """Remove the partial save; a one-line error naming the directory and the bytes needed."""
    _, need, prev = _need_bytes(root, tmp, step)
    shutil.rmtree(tmp, ignore_errors=True)
    free = shutil.disk_usage(root).free if root.exists() else 0
    kept = f"; {Path(prev[-1]['path']).name} is intact" if prev else ""
    return UserError(f"disk full: saving checkpoint step_{step} into {root} needs about {need:,} bytes, "
                     f"{free:,} free; the partial save was removed{kept}: free space or choose another "
                     "--output_dir, then --resume latest")


def save_checkpoint(accelerator, run_dir: str | os.PathLike, state: dict[str, Any], *,
                    keep_last: int, config_yaml: str | None = None,
                    extra: Callable[[Path], None] | None = None,
                    _fault: Callable[[str], None] | None = None) -> Path:
    """Save ``accelerator`` state + ``state`` as ``checkpoints/step_{state['step']}`` atomically.

    Must be called on every process (DeepSpeed saves are collective). ``_fault`` is a test hook
    called with a stage name ("after_state", "after_manifest", "after_swap", "in_prune") to simulate
    a crash mid-save. ``extra(tmp_dir)`` writes more files (main process) before the folder is
    committed. A full disk (ENOSPC/EDQUOT) removes the partial save and raises a one-line UserError.
    """
    root = checkpoints_dir(run_dir)
    step = int(state["step"])
    final, tmp = root / f"step_{step}", root / f".tmp-step_{step}"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        _clean_leftovers(root)
    accelerator.wait_for_everyone()
    try:
        _write_state(accelerator, tmp, state, config_yaml, extra, _fault)
    except Exception as e:
        if not _is_disk_full(e, root, tmp, step):
            raise
        raise _disk_full(root, tmp, step) from None
    if accelerator.is_main_process:
        old = root / f".old-{final.name}"
        if final.exists():  # re-saving a step (a resume from an older checkpoint): swap, then delete
            os.rename(final, old)
            if _fault:
                _fault("after_swap")
        os.rename(tmp, final)
        fsync_dir(root)
        shutil.rmtree(old, ignore_errors=True)
        write_atomic(root / "latest", final.name + "\n")
        recompute_best(run_dir)  # the step just saved may replace the best one with a worse model
        _prune(run_dir, keep_last, keep=final, _fault=_fault)
        recompute_best(run_dir)
    accelerator.wait_for_everyone()
    return final


def _write_state(accelerator, tmp: Path, state, config_yaml, extra, _fault) -> None:
    """Everything of one checkpoint into ``tmp``: accelerate's state, config, extras, the trainer
    state, and last the manifest over all of them."""
    # accelerate warns "Removed shared tensor {'lm_head.weight'}" at every save of a tied model;
    # expected here (the tie is restored on load, which the resume tests check), so keep it quiet.
    quiet = logging.getLogger("accelerate.utils.other")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    handle = accelerator.register_save_state_pre_hook(own_storage_for_views)
    try:
        accelerator.save_state(str(tmp), safe_serialization=True)
    finally:
        handle.remove()
        quiet.setLevel(level)
    accelerator.wait_for_everyone()
    if _fault:
        _fault("after_state")
    if accelerator.is_main_process:
        if config_yaml is not None:
            (tmp / "config.yaml").write_text(config_yaml)
        if extra is not None:
            extra(tmp)
        state = dict(state, saved_at=time.strftime("%Y-%m-%dT%H:%M:%S"))
        write_atomic(tmp / STATE_FILE, json.dumps(state, indent=2))
        write_manifest(tmp, write_atomic)  # last: a folder with a manifest is whole
        fsync_dir(tmp)
        if _fault:
            _fault("after_manifest")


def _prune(run_dir, keep_last: int, keep: Path, _fault=None) -> None:
    """Delete all but the newest ``keep_last``, ``best``, ``latest`` and ``keep`` (the checkpoint just
    saved and verified: the last good one), and any folder a reader pins (run_lock.py). Each folder is
    first renamed to ``.del-step_N`` (one atomic rename: never listed again), then deleted, so a crash
    never leaves a half-deleted folder that lists as complete; the next save removes ``.del-*`` leftovers."""
    ckpts = list_checkpoints(run_dir)
    kept = {str(keep)} | {c["path"] for c in ckpts[-keep_last:]}
    for name in ("best", "latest"):
        p = read_pointer(run_dir, name)
        if p is not None:
            kept.add(str(p))
    root = checkpoints_dir(run_dir)
    for c in ckpts:
        if c["path"] in kept:
            continue
        claim = try_claim(c["path"])
        if claim is None:
            continue  # a reader (export, eval) pins it: the next save prunes it
        try:
            doomed = root / f".del-step_{c['step']}"
            shutil.rmtree(doomed, ignore_errors=True)
            os.rename(c["path"], doomed)
            fsync_dir(root)
            if _fault:
                _fault("in_prune")
            shutil.rmtree(doomed, ignore_errors=True)
        finally:
            os.close(claim)

