"""`TrainState`: the run's progress, the one thing a resume restores, whole; `RunInfo`: what the run that
wrote a checkpoint was. Together they are every checkpoint's ``trainer_state.json`` (one flat object).

Written (`state_file_dict`) and read (`parse_state_file` / `read_state_file`) only here. Versioned:
``version`` 2 is this schema; a version-1 file (yxanul before the Trainer class: no ``version``,
``best_val_loss`` or ``wandb_run_id``) still loads with those two empty. A missing or unknown field is a
one-line :class:`~yxanul.errors.UserError` naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checkpoint.manifest import STATE_FILE
from ..errors import UserError

SCHEMA_VERSION = 3
_ADDED_IN_V2 = {"version": 1, "best_val_loss": None, "wandb_run_id": None}
_ADDED_IN_V3 = {"val_sequences": 0}  # 0: not recorded (a resume then has nothing to compare)
_LISTED = {"path"}  # added to the dict by checkpoint listings; not in the file
_NOT_IN_FILE = {"evaluated_at"}  # TrainState fields the file holds implicitly (see parse_state_file)
_OPTIONAL = {"saved_at"}


@dataclass
class TrainState:
    """The run's progress: everything a resume restores besides accelerate's files (weights, optimizer,
    RNG). Saved and restored whole (`state_file_dict` / `parse_state_file`): a field added here travels
    through every checkpoint and resume with no other change (give it a default for older files)."""

    step: int = 0                          # optimizer steps done
    tokens_seen: int = 0                   # training tokens consumed (all processes)
    epoch: int = 0                         # the epoch of the last saved step's batches (``data``: the next one's)
    data: dict | None = None               # WindowLoader.state_dict() at the last save: the exact data position
    val_loss: float | None = None          # the last validation LM loss
    best_val_loss: float | None = None     # best validation LM loss of the run so far
    wandb_run_id: str | None = None        # the W&B run a resume continues
    evaluated_at: int | None = None        # step of ``val_loss``; the file keeps val_loss only when it is this step

    def record_eval(self, val_loss: float) -> None:
        """The LM validation loss of this step; ``best_val_loss`` follows (a None never compares)."""
        self.val_loss, self.evaluated_at = val_loss, self.step
        if math.isfinite(val_loss) and (self.best_val_loss is None or val_loss < self.best_val_loss):
            self.best_val_loss = val_loss

    @classmethod
    def read(cls, ckpt_dir) -> TrainState:
        return read_state_file(ckpt_dir, cls)[0]


@dataclass
class RunInfo:
    """What the run that wrote a checkpoint was, saved beside its progress: shown and compared on resume
    (``resumed from ... (world_size: 1 -> 2)``) and listed, never restored -- a resumed run is what its own
    config, accelerator and batch plan make it."""

    precision: str = "FP32"                # the plan's label (FP8 / BF16 / FP32)
    backend: str = "torch"                 # model backend that wrote the weights
    world_size: int = 1
    tokens_per_step: int = 0
    val_sequences: int = 0                 # the validation set's size (eval batches x micro-batch), 0: not saved
    fp8: bool = False                      # the precision plan's metadata (plan.metadata())
    mixed_precision: str = "fp32"
    fp8_recipe: str | None = None
    fp8_recipe_kwargs: dict | None = None
    fp8_fallback_reason: str | None = None
    version: int = SCHEMA_VERSION
    saved_at: str | None = None            # set by yxanul.checkpoint.save_checkpoint


def _names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def state_file_dict(state: TrainState, info: RunInfo) -> dict[str, Any]:
    """The dict saved as ``trainer_state.json``: all of ``state`` (``val_loss`` only when it was measured at
    this step) and ``info`` (``saved_at`` is added by the save)."""
    d = {k: v for k, v in dataclasses.asdict(state).items() if k not in _NOT_IN_FILE}
    if state.evaluated_at != state.step:
        d["val_loss"] = None
    d.update(dataclasses.asdict(info))
    d.pop("saved_at")
    return d


def parse_state_file(d: dict[str, Any], source: str = STATE_FILE,
                     state_cls=TrainState) -> tuple[TrainState, RunInfo]:
    """``trainer_state.json``'s dict as (progress, run info); strict about the fields of both."""
    if not isinstance(d, dict):
        raise UserError(f"{source}: expected a JSON object, got {type(d).__name__}")
    progress = [n for n in _names(state_cls) if n not in _NOT_IN_FILE]
    known = set(progress) | set(_names(RunInfo))
    unknown = sorted(set(d) - known - _LISTED)
    if unknown:
        raise UserError(f"{source}: unknown field '{unknown[0]}' (schema version {SCHEMA_VERSION}; "
                        "written by a newer yxanul?)")
    version = d.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int):
        raise UserError(f"{source}: field 'version' is not an integer ({version!r})")
    values = {**(_ADDED_IN_V2 if version < 2 else {}), **(_ADDED_IN_V3 if version < 3 else {}), **d}
    missing = sorted(known - set(values) - _OPTIONAL)
    if missing:
        raise UserError(f"{source}: missing field '{missing[0]}'")
    state = state_cls(**{n: values[n] for n in progress})
    state.evaluated_at = state.step if state.val_loss is not None else None
    return state, RunInfo(**{n: values[n] for n in _names(RunInfo) if n in values})


def read_state_file(ckpt_dir, state_cls=TrainState) -> tuple[TrainState, RunInfo]:
    path = Path(ckpt_dir) / STATE_FILE
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not a readable trainer state ({type(e).__name__}: {e})") from None
    return parse_state_file(d, source=str(path), state_cls=state_cls)
