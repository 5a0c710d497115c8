"""The run directory of a config: its name settled once (the same on every rank), and what would lose or
misplace work refused before anything is built (a new run over checkpoints, ``resume latest`` with nothing
to resume, an output_dir under a file)."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import NamedTuple

from ..errors import EveryRankError, UserError
from .args import RUN_DIR_RESUMES
from .io import file_in_the_way, saved_config
from .pointers import checkpoints_dir
from .resume import is_hf_trainer_checkpoint, list_checkpoints


def _names(cfg) -> tuple[str, str]:
    """(run_name, output_dir) of a config: the given ones, else (a resume into a given output_dir) the name that
    directory's run was started with, else ``<model>-<timestamp>``; and ``runs/<run_name>``."""
    ck = cfg.checkpoint
    name = ck.run_name or (_saved_name(ck.output_dir) if ck.resume and ck.output_dir else None)
    name = name or f"{cfg.model.model}-{time.strftime('%Y%m%d-%H%M%S')}"
    return name, ck.output_dir or str(Path("runs") / name)


def _saved_name(output_dir: str) -> str | None:
    """The run_name a resumed run directory was started with: a new default name per session would make each
    session a TensorBoard run of its own (``tensorboard/<run_name>``) and rename the W&B run."""
    try:
        name = saved_config(output_dir).get("run_name")
    except Exception:  # noqa: BLE001 - an unreadable config.yaml: the resume reports what it needs itself
        return None
    return name if isinstance(name, str) and name else None


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
        raise EveryRankError(f"resume '{ck.resume}': set --output_dir or --run_name too (the default run directory is "
                        "new at every launch)")
    # settle the names once, explicitly: config.yaml and the trackers record the run directory used
    names = _names(cfg)
    if dist is not None and dist.num_processes > 1 and ck.run_name is None:
        from accelerate.utils import broadcast_object_list

        names = tuple(broadcast_object_list([names], from_process=0)[0])  # sync point: every rank
    settled = dataclasses.replace(ck, **dict(zip(("run_name", "output_dir"), names)))
    run_dir = Path(settled.output_dir)
    if existing := file_in_the_way(checkpoints_dir(run_dir)):  # found at setup, not at the first save
        why = " (the run keeps its checkpoints in that folder)" if existing.parent == run_dir else ""
        raise EveryRankError(f"output_dir '{run_dir}': '{existing}' exists and is not a directory{why}")
    _check_not_in_checkpoints(run_dir)
    _check_resume_target(ck.resume, run_dir)
    ckpts = [] if ck.resume and not _resumes_another_run(ck.resume, run_dir) else list_checkpoints(run_dir)
    if ckpts:
        of = f" of another run than resume '{ck.resume}'" if ck.resume else ""
        raise EveryRankError(f"output_dir '{run_dir}' already holds checkpoints{of} (newest: step "
                             f"{ckpts[-1]['step']}): add --resume latest to continue that run, or choose another "
                             "--output_dir/--run_name")
    return run_dir, settled


def _resumes_another_run(resume: str, run_dir: Path) -> bool:
    """``resume`` is a path outside ``run_dir``: a checkpoint (``RUN/checkpoints/step_N``, or a folder of its own)
    or a run directory of another run, whose training would otherwise move this run's ``latest`` and prune it."""
    if resume in RUN_DIR_RESUMES:
        return False
    p = Path(resume).resolve()
    home = p.parent.parent if p.parent.name == checkpoints_dir(".").name else p
    return home != run_dir.resolve()


def _check_not_in_checkpoints(run_dir: Path) -> None:
    """A run directory is never a checkpoint folder nor inside a run's checkpoints folder: its config.yaml,
    metrics and new checkpoints would change a checkpoint (which then fails verification) or be pruned."""
    here = run_dir.resolve()
    for p in (here, *here.parents):
        if p.name == checkpoints_dir(".").name and ((p / "latest").is_file() or list_checkpoints(p.parent)):
            raise EveryRankError(f"output_dir '{run_dir}': inside the checkpoints folder of the run '{p.parent}' "
                                 "(a run there would change its checkpoints): choose a run directory outside it")
    if (here / "trainer_state.json").is_file():
        raise EveryRankError(f"output_dir '{run_dir}': a checkpoint folder, not a run directory: choose another "
                             "--output_dir (to continue from it: --resume with this path)")


def _check_resume_target(resume: str | None, run_dir: Path) -> None:
    """Before anything is built: ``latest`` with no checkpoint under the run directory, or a path that
    does not exist, is a mistyped directory, not a new run (``auto`` is the value that allows one)."""
    if resume == "latest" and not _has_checkpoints(run_dir):
        raise EveryRankError(f"resume 'latest': no checkpoint under '{run_dir}' (a mistyped --output_dir/--run_name? "
                        "`--resume auto` resumes if there is one and starts fresh otherwise)")
    if resume not in (None, *RUN_DIR_RESUMES) and not Path(resume).exists():
        raise EveryRankError(f"resume '{resume}': no such checkpoint or run directory")


def _has_checkpoints(run_dir: str | os.PathLike) -> bool:
    return (checkpoints_dir(run_dir) / "latest").is_file() or bool(list_checkpoints(run_dir))


class EarlierOutput(NamedTuple):
    """What an earlier output of a command looks like, the one non-empty folder its ``--overwrite`` replaces:
    ``marker`` at its top and, when ``flat``, files only (an HF export folder has no subfolders)."""

    command: str  # as the user types it: `yxanul export`
    marker: str
    flat: bool

    def holds(self, folder: Path) -> bool:
        return (folder / self.marker).is_file() and not (self.flat and any(p.is_dir() for p in folder.iterdir()))


def check_out_spares_runs(out: str | Path, source: str | Path, label: str, overwrite: bool,
                          earlier: EarlierOutput) -> None:
    """An output folder that a command fills, and under ``overwrite`` replaces (`yxanul export` OUT, `yxanul grpo
    --output_dir`), must spare every trained file: not the MODEL it reads nor a folder above it, nothing in the
    MODEL's run's checkpoints folder (its checkpoints, ``best``/``latest``), not a run directory (its checkpoints
    and logs); and ``overwrite`` replaces only an ``earlier`` output of the same command, never another non-empty
    folder (a folder of runs, a home directory). One line naming ``label`` (the command's name for OUT)."""
    out, o, src = Path(out), Path(out).resolve(), Path(source).resolve()
    if o == src or o in src.parents:
        raise UserError(f"{label} '{out}': would overwrite the MODEL '{source}' it reads (choose a folder outside it)")
    if blocker := file_in_the_way(out):
        raise UserError(f"{label} '{out}': '{blocker}' is a file, not a folder (choose another {label.split()[-1]})")
    run = src if (src / "checkpoints").is_dir() else src.parent.parent if src.parent.name == "checkpoints" else None
    filled = o.is_dir() and any(o.iterdir())
    if src.parent.name == "checkpoints" and src in o.parents:
        raise UserError(f"{label} '{out}': inside the checkpoint '{source}' it reads (choose a folder outside it)")
    if run is not None and (run / "checkpoints" == o or run / "checkpoints" in o.parents or
                            (run in o.parents and filled and not earlier.holds(o))):
        raise UserError(f"{label} '{out}': inside the run '{run}' whose files it would replace (choose a new "
                        "folder, or one outside the run)")
    if filled and not overwrite:
        raise UserError(f"{label} '{out}': exists and is not empty (choose another folder or --overwrite)")
    if filled:
        _check_replaceable(out, o, label, earlier)


def _check_replaceable(out: Path, o: Path, label: str, earlier: EarlierOutput) -> None:
    """A non-empty OUT under ``--overwrite``: an earlier output of the command, and no run or Trainer output."""
    if (o / "checkpoints").is_dir() or ((o / "config.yaml").is_file() and not (o / "config.json").is_file()):
        raise UserError(f"{label} '{out}': a run directory, whose checkpoints and logs --overwrite would replace "
                        "(choose a new folder)")
    if any(o.glob("checkpoint-*/trainer_state.json")) or is_hf_trainer_checkpoint(o):
        raise UserError(f"{label} '{out}': a transformers Trainer output (its checkpoints, optimizer and logs), "
                        "which --overwrite would replace (choose a new folder)")
    if not earlier.holds(o):
        shape = f"{earlier.marker} at its top" + (", files only" if earlier.flat else "")
        raise UserError(f"{label} '{out}': not an earlier `{earlier.command}` output ({shape}), and --overwrite "
                        "replaces only those (choose a new or empty folder)")
