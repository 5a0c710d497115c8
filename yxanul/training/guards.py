"""Trainer-side protections: a collapsed model stops like a diverged one, and a non-finite val loss
stops before sampling (where torch.multinomial would fail on NaN probabilities).

Call sites in the training loop (see docs/training.md, "What survives what"):
- ``guard = CollapseGuard()`` once before the loop;
- ``guard.observe(step, norm_val)`` at every logged step (after the loss/norm are on the host);
- ``guard.before_save(step, norm, loss_finite, run_dir)`` in the save path, before any checkpoint file is written;
- ``check_val_loss(step, val_loss, run_dir)`` right after the validation loss is computed, before
  the sample is generated.
Each raises :class:`~yxanul.errors.TrainingDiverged` (one line, exit code 3, no checkpoint written).
"""

from __future__ import annotations

import math

from ..errors import TrainingDiverged

COLLAPSE_PATIENCE = 3  # logged steps in a row with a zero gradient norm


def _as_float(norm) -> float:
    if norm is None:
        return float("nan")
    return float(norm.item() if hasattr(norm, "item") else norm)


class CollapseGuard:
    """A model whose gradient norm is exactly 0 learns nothing ever again (all-zero or saturated
    weights: the loss sits at ln V); a non-finite one has diverged. Either stops the run (exit 3)
    instead of becoming ``latest``: at ``patience`` logged steps in a row, or at once at a save."""

    def __init__(self, patience: int = COLLAPSE_PATIENCE):
        self.patience, self.zero_steps = patience, 0

    def observe(self, step: int, norm) -> None:
        value = _as_float(norm)
        if norm is None:
            return
        if not math.isfinite(value):
            raise TrainingDiverged(f"step {step}: gradient norm {value}: stopping (lower max_lr, or check the data)")
        self.zero_steps = self.zero_steps + 1 if value == 0.0 else 0
        if self.zero_steps >= self.patience:
            raise TrainingDiverged(f"step {step}: gradient norm 0 at {self.zero_steps} logged steps in a row: "
                                   "the model has collapsed (it can no longer learn); stopping without saving it "
                                   "(resume from an earlier checkpoint with a lower max_lr)")

    def before_save(self, step: int, norm, loss_finite: bool = True, run_dir=None) -> None:
        """Raises instead of a checkpoint of a diverged (loss or norm not finite) or collapsed (norm 0) model."""
        value = _as_float(norm)
        where = f" in {run_dir}/checkpoints" if run_dir is not None else ""
        if not loss_finite or (norm is not None and not math.isfinite(value)):
            raise TrainingDiverged(f"step {step}: loss or gradient norm is not finite; no checkpoint written over the "
                                   f"good ones{where} (lower max_lr, or check the data)")
        if norm is not None and value == 0.0:
            raise TrainingDiverged(f"step {step}: gradient norm 0 at a checkpoint step: the model has collapsed; no "
                                   f"checkpoint written over the good ones{where} (resume from an earlier checkpoint "
                                   "with a lower max_lr)")


def check_val_loss(step: int, val_loss: float, run_dir=None) -> None:
    """A non-finite validation loss stops the run before sampling or saving (exit 3)."""
    if not math.isfinite(val_loss):
        where = f" in {run_dir}/checkpoints" if run_dir is not None else ""
        raise TrainingDiverged(f"step {step}: validation loss {val_loss}: the model has diverged; no sample, no "
                               f"checkpoint written over the good ones{where} (lower max_lr, or check the data)")
