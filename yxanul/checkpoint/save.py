"""Saving a checkpoint: ``RUN/checkpoints/step_N/`` written atomically, a ``latest`` pointer,
best-by-val-loss kept, the last ``keep_last`` kept.

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
``.del-step_N`` before deleting it. A full disk removes the partial save and is one line naming the
directory and the bytes needed. Verification before use (resume, init_from) and the fallback from a
damaged ``latest`` live in resume.py, the run directory in rundir.py, the pointers in pointers.py, the
atomic writes and weight loading in io.py, the manifest in manifest.py, the listing table in table.py.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import shutil
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from ..errors import UserError, is_no_space
from ..run_lock import try_claim
from .io import fsync_dir, own_storage_for_views, weights_mode_like, write_atomic
from .manifest import MANIFEST, STATE_FILE, checkpoint_bytes, write_manifest
from .pointers import checkpoints_dir, read_pointer, recompute_best
from .resume import list_checkpoints


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
                    extra: Callable[[Path], None] | None = None, left_behind: Collection[str] = (),
                    _fault: Callable[[str], None] | None = None) -> Path:
    """Save ``accelerator`` state + ``state`` as ``checkpoints/step_{state['step']}`` atomically.

    Must be called on every process (DeepSpeed saves are collective). ``_fault`` is a test hook
    called with a stage name ("after_state", "after_manifest", "after_swap", "in_prune") to simulate
    a crash mid-save. ``extra(tmp_dir)`` writes more files (main process) before the folder is
    committed. A full disk (ENOSPC/EDQUOT) removes the partial save and raises a one-line UserError.
    ``left_behind``: the paths of checkpoints a resume went back from (`left_behind`), never counted among
    the ``keep_last`` newest.
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
        _prune(run_dir, keep_last, keep=final, step=step, left_behind=left_behind, _fault=_fault)
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
        # milliseconds: the fallback after a damaged `latest` ranks the checkpoints by it (resume.py `_candidates`)
        state = dict(state, saved_at=datetime.datetime.now().isoformat(timespec="milliseconds"))
        write_atomic(tmp / STATE_FILE, json.dumps(state, indent=2))
        for f in tmp.glob("*.safetensors"):  # accelerate's model*.safetensors and the FP8 state: 0600 as written
            weights_mode_like(f, tmp / STATE_FILE)
        write_manifest(tmp, write_atomic)  # last: a folder with a manifest is whole
        fsync_dir(tmp)
        if _fault:
            _fault("after_manifest")


def left_behind(run_dir, step: int) -> set[str]:
    """The checkpoints of ``run_dir`` past ``step``, the one a resume continues: a damaged ``latest`` the resume
    skipped, or those past a checkpoint named explicitly. Counted among the newest ``keep_last``, a damaged one
    would prune the good checkpoint the run resumed from; a run that saves a step again drops it from the set."""
    return {c["path"] for c in list_checkpoints(run_dir) if c["step"] > step}


def _prune(run_dir, keep_last: int, keep: Path, step: int, left_behind: Collection[str] = (), _fault=None) -> None:
    """Delete all but the newest ``keep_last`` up to ``step`` (that of ``keep``, the checkpoint just saved and
    verified: the last good one), ``best``, ``latest``, ``keep``, any folder a reader pins (run_lock.py) and
    every checkpoint past ``step``: those of a run this one went back from (``--resume RUN/checkpoints/step_8``
    past a step_12), which its own saves replace step by step; ranked among them, they would have pruned every
    checkpoint of the run going on. Those in ``left_behind`` are not counted among the newest. Each folder is
    first renamed to ``.del-step_N`` (one atomic rename: never listed again), then deleted, so a crash never
    leaves a half-deleted folder that lists as complete; the next save removes ``.del-*`` leftovers."""
    ckpts = list_checkpoints(run_dir)
    ours = [c for c in ckpts if c["step"] <= step and (c["path"] not in left_behind or c["path"] == str(keep))]
    kept = {str(keep)} | {c["path"] for c in ours[-keep_last:]} | {c["path"] for c in ckpts if c["step"] > step}
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

