"""`PrecisionCallback`: the precision report (with TE's read-back) and FP8 statistics for `transformers.Trainer`.

- ``on_train_begin``: ``output_dir/precision_report.json`` and the report on the console (main
  process), from the plan: TE's read-back is recorded during the first training forward.
- ``on_log`` of a training log (every ``logging_steps``): ``fp8/*`` scaling statistics
  (precision/stats.py) when FP8 is on; at the first training log, and again once TE's read-back
  arrives, the report goes to ``output_dir`` again and, flattened to numbers under ``precision/*``
  (``precision/fp8``, ``precision/te_readback/fp8_confirmed``, ``precision/configured_recipe/kwargs/
  margin``, ...), into the same ``logs`` dict: every ``report_to`` logger after this callback (W&B,
  TensorBoard, MLflow, ...) and ``trainer_state.json``'s log history receive it. The whole report,
  strings included (recipe, fallback reason), goes to TensorBoard as text and to the W&B run config
  (`report_to` loggers that hold text; scalars-only logs would drop strings with a warning).
- ``on_save``: the delayed-scaling state next to Trainer's checkpoint (``fp8_state.safetensors``,
  tensors only: TE's own extra state is a pickle, precision/state.py).

Mutating ``logs`` reaches the loggers only if this callback runs before them: `YxanulTrainer` puts
it first. Added to a plain `Trainer`, insert it the same way:
``trainer.callback_handler.callbacks.insert(0, PrecisionCallback(plan))``.
"""

from __future__ import annotations

import json
import os

from transformers import TrainerCallback

from ..checkpoint.io import write_atomic
from ..checkpoint.manifest import write_manifest
from ..precision import format_report, precision_report
from ..tracking import flat_tracker_config

REPORT = "precision_report.json"


def flat_numbers(d: dict, prefix: str) -> dict[str, float]:
    """Nested dict -> {"prefix/a/b": float} for its numbers and booleans (strings, lists and None left out:
    a Trainer log takes scalars only). The flattening is the trackers' own (`flat_tracker_config`)."""
    return {k: float(v) for k, v in flat_tracker_config(d, prefix + "/").items()
            if isinstance(v, (bool, int, float))}


class PrecisionCallback(TrainerCallback):
    """Reports what a `PrecisionPlan` decided and what TE says ran (see the module docstring)."""

    def __init__(self, plan, say=print, loggers=None):
        self.plan, self.say = plan, say
        self.loggers = loggers  # the other callbacks (YxanulTrainer passes Trainer's list), for the whole report
        self.report: dict | None = None
        self._logged_with_readback = False
        self._logged_once = False

    def _write(self, args, state, model, show: bool = True) -> dict:
        self.report = precision_report(model, self.plan)
        if state.is_world_process_zero:
            os.makedirs(args.output_dir, exist_ok=True)
            with open(os.path.join(args.output_dir, REPORT), "w") as f:
                json.dump(self.report, f, indent=2, default=str)
            if show:
                self.say(format_report(self.report))
        return self.report

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None:
            self._write(args, state, model)

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        if logs is None or model is None or "loss" not in logs:  # training logs only (not eval, not the summary)
            return
        # Trainer.log appends a copy of ``logs`` to the log history before on_log: that copy gets the keys too
        history = state.log_history[-1] if state.log_history and state.log_history[-1].get("step") == \
            state.global_step and state.log_history[-1].get("loss") == logs["loss"] else {}
        if self.plan.fp8_enabled and self.plan.args.fp8_stats:
            stats = {f"fp8/{k}": v for k, v in self.plan.fp8_stats(model).items()}
            logs.update(stats)
            history.update(stats)
        readback = self.plan.readback is not None
        if not self._logged_once or (readback and not self._logged_with_readback):
            rep = self._write(args, state, model, show=readback and not self._logged_with_readback)
            logs.update(flat_numbers(rep, "precision"))
            history.update(flat_numbers(rep, "precision"))
            if state.is_world_process_zero:
                self._whole_report(rep, state.global_step)
            self._logged_once, self._logged_with_readback = True, readback

    def on_train_end(self, args, state, control, model=None, **kwargs):
        # a run shorter than logging_steps logs no training loss, so on_log never saw the read-back that the
        # first forward recorded: the report on disk would still say "FP8?" (seen under DeepSpeed, 4 steps)
        if model is not None and self.plan.readback is not None and not self._logged_with_readback:
            self._write(args, state, model)
            self._logged_with_readback = True

    def _whole_report(self, rep: dict, step: int) -> None:
        """The whole report, strings included, where a logger can hold it: TensorBoard text
        (``precision_report``), the W&B run config (``precision_report``)."""
        text = "```\n" + json.dumps(rep, indent=2, default=str) + "\n```"  # markdown code block in TensorBoard
        for cb in self.loggers or ():
            writer = getattr(cb, "tb_writer", None)
            if writer is not None and hasattr(writer, "add_text"):
                writer.add_text("precision_report", text, global_step=step)
                writer.flush()
            run = getattr(getattr(cb, "_wandb", None), "run", None)
            if run is not None:
                run.config.update({"precision_report": rep}, allow_val_change=True)

    def on_save(self, args, state, control, model=None, **kwargs):
        if not (self.plan.fp8_enabled and state.is_world_process_zero and model is not None):
            return
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        ckpt = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if os.path.isdir(ckpt):
            self.plan.save_fp8_state(model, ckpt)


class ManifestCallback(TrainerCallback):
    """Last at every save: ``manifest.json`` (sizes and sha256 of every file, yxanul's manifest.py) into
    Trainer's ``checkpoint-N``, so that a resume verifies it as yxanul's own checkpoints are verified."""

    def on_save(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        ckpt = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if os.path.isdir(ckpt):
            write_manifest(ckpt, write_atomic)
