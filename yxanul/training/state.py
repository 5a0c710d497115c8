"""`TrainState`: the run's progress, and the schema of every checkpoint's ``trainer_state.json``.

Written (`to_dict`) and read (`from_dict` / `read`) only here. Versioned: ``version`` 2 is this
schema; a version-1 file (yxanul before the Trainer class: no ``version``, ``best_val_loss`` or
``wandb_run_id``) still loads with those two empty. A missing or unknown field is a one-line
:class:`~yxanul.errors.UserError` naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checkpoint.manifest import STATE_FILE
from ..errors import UserError

SCHEMA_VERSION = 2
_ADDED_IN_V2 = {"version": 1, "best_val_loss": None, "wandb_run_id": None}
_WRITTEN_BY_CHECKPOINT = {"saved_at"}  # added by yxanul.checkpoint.save_checkpoint; not progress


@dataclass
class TrainState:
    """Everything a resume needs besides accelerate's files (weights, optimizer, RNG)."""

    step: int = 0                          # optimizer steps done
    tokens_seen: int = 0                   # training tokens consumed (all processes)
    epoch: int = 0                         # the loader's epoch
    data: dict | None = None               # WindowLoader.state_dict(): the exact data position
    val_loss: float | None = None          # validation LM loss measured AT this step, else None
    best_val_loss: float | None = None     # best validation LM loss of the run so far
    precision: str = "FP32"                # the plan's label (FP8 / BF16 / FP32)
    backend: str = "torch"                 # model backend that wrote the weights
    world_size: int = 1
    tokens_per_step: int = 0
    fp8: bool = False                      # the precision plan's metadata (plan.metadata())
    mixed_precision: str = "fp32"
    fp8_recipe: str | None = None
    fp8_recipe_kwargs: dict | None = None
    fp8_fallback_reason: str | None = None
    wandb_run_id: str | None = None        # the W&B run a resume continues
    version: int = SCHEMA_VERSION
    saved_at: str | None = field(default=None, compare=False)  # set by save_checkpoint

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("saved_at")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = STATE_FILE) -> TrainState:
        if not isinstance(d, dict):
            raise UserError(f"{source}: expected a JSON object, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names - _WRITTEN_BY_CHECKPOINT - {"path"})  # path: added by listings
        if unknown:
            raise UserError(f"{source}: unknown field '{unknown[0]}' (schema version {SCHEMA_VERSION}; "
                            "written by a newer yxanul?)")
        values = dict(d)
        if "version" not in values:  # version 1
            values = {**_ADDED_IN_V2, **values}
        missing = [n for n in names if n not in values and n != "saved_at"]
        if missing:
            raise UserError(f"{source}: missing field '{sorted(missing)[0]}'")
        values.pop("path", None)
        return cls(**values)

    @classmethod
    def read(cls, ckpt_dir) -> TrainState:
        path = Path(ckpt_dir) / STATE_FILE
        try:
            return cls.from_dict(json.loads(path.read_text()), source=str(path))
        except (OSError, json.JSONDecodeError) as e:
            raise UserError(f"{path}: not a readable trainer state ({type(e).__name__}: {e})") from None

    def record_eval(self, val_loss: float) -> None:
        """The LM validation loss of this step; ``best_val_loss`` follows (a None never compares)."""
        self.val_loss = val_loss
        if math.isfinite(val_loss) and (self.best_val_loss is None or val_loss < self.best_val_loss):
            self.best_val_loss = val_loss

    def for_checkpoint(self, evaluated_at: int | None) -> dict[str, Any]:
        """The dict saved with a checkpoint: ``val_loss`` only when it was measured at this step."""
        d = self.to_dict()
        if evaluated_at != self.step:
            d["val_loss"] = None
        return d
