"""What a run reports besides its step and eval lines: the precision report (console and
``precision_report.json``, rebuilt once TE has read back), the trackers' start with the run config,
and the run's summary (``summary.json``)."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

import yaml
from accelerate.tracking import TensorBoardTracker

from ..checkpoint import saved_config
from ..precision import format_report, precision_report
from ..tracking import RUN_ID_FILE, flat_tracker_config, tracker_init_kwargs, wandb_run_id
from .schedule import lr_at, schedule_of


class PrecisionReport:
    """The precision report of a run (``self.data``): built after ``accelerate.prepare``, rebuilt once
    after the first FP8 forward, when TE has reported back; the main process writes the file."""

    def __init__(self, plan, run_dir: Path, is_main: bool, say):
        self.plan, self.path, self.is_main, self.say = plan, Path(run_dir) / "precision_report.json", is_main, say
        self.data: dict[str, Any] = {}

    def build(self, model) -> dict[str, Any]:
        self.data = precision_report(model, self.plan)
        self.say(format_report(self.data))
        return self.data

    def refresh(self, model) -> None:
        """Once TE has reported back (after the first FP8 forward), the report with its read-back."""
        if self.plan.fp8_enabled and self.data.get("te_readback") is None and self.plan.readback is not None:
            self.build(model)
            self.write()

    def write(self) -> None:
        if self.is_main:
            self.path.write_text(json.dumps(self.data, indent=2, default=str))


def start_trackers(accelerator, cfg, run_dir: Path, run_name: str, model, plan, wandb_id: str | None,
                   say, first_step: int = 1) -> str | None:
    """accelerate's trackers, with the flat run config and ``model``'s precision report as their config
    (TensorBoard hparams, W&B config): call it after the first step so that the report carries TE's
    read-back. ``first_step`` > 1 (a resume): TensorBoard drops the events of that step and later ones that
    an earlier session logged past its last checkpoint (``purge_step``), so the resumed curve replaces them
    instead of doubling back. Returns the W&B run id (``wandb_id`` as given without W&B), also written to the
    run dir."""
    tr = cfg.tracking
    if tr.use_wandb:
        wandb_id = wandb_run_id(run_dir, wandb_id)
        if accelerator.is_main_process:
            (run_dir / RUN_ID_FILE).write_text(wandb_id + "\n")
    init = tracker_init_kwargs(tr, run_dir, run_name, wandb_id, say=say)
    if tr.use_tensorboard:
        name_tensorboard_run(accelerator, run_name, purge_step=first_step if first_step > 1 else None)
    config = flat_tracker_config({**cfg.to_flat_dict(), "precision_report": precision_report(model, plan)})
    init_trackers_or_offline(accelerator, tr.wandb_project if tr.use_wandb else run_name, init, config, say)
    return wandb_id


def name_tensorboard_run(accelerator, run_name: str, purge_step: int | None) -> None:
    """TensorBoard writes to ``<logging_dir>/<run_name>`` with or without W&B. accelerate names every tracker
    it builds from ``init_trackers``' one project name, which W&B needs as its project: turning ``--use_wandb``
    on or off between sessions would move the run's TensorBoard events to another folder. A tracker instance
    in ``log_with`` keeps its own name (accelerate starts it in ``init_trackers``)."""
    kwargs = {"purge_step": purge_step} if purge_step else {}  # to SummaryWriter: a resume replaces later steps
    accelerator.log_with = [TensorBoardTracker(run_name, accelerator.logging_dir, **kwargs)
                            if str(t) == "tensorboard" else t for t in accelerator.log_with]


def init_trackers_or_offline(accelerator, project: str, init: dict, config: dict, say) -> None:
    """accelerate's init_trackers; when W&B cannot start (an unreachable or failing server, a refused key),
    one warning and W&B logs offline (`wandb sync` later), and if even that fails, training goes on
    without W&B: a tracker never stops training."""
    if "wandb" not in init:
        accelerator.init_trackers(project, init_kwargs=init, config=config)
        return
    try:
        accelerator.init_trackers(project, init_kwargs=init, config=config)
        return
    except Exception as e:  # noqa: BLE001 - wandb.errors.CommError, UsageError, timeouts, ...
        if not _raised_in_wandb(e):
            raise  # TensorBoard's (a full disk: the CLI's one line), not W&B's
        why = f"{type(e).__name__}: {' '.join(str(e).split())[:160]}"
    _reset_trackers(accelerator)
    if init["wandb"].get("mode", os.environ.get("WANDB_MODE")) not in ("offline", "disabled"):  # else: retry = same
        say(f"warning: W&B could not start online ({why}); logging offline instead (sync later with "
            f"`wandb sync {init['wandb']['dir']}/wandb`)", flush=True)
        init = {**init, "wandb": {**init["wandb"], "mode": "offline"}}
        try:
            accelerator.init_trackers(project, init_kwargs=init, config=config)
            return
        except Exception as e:  # noqa: BLE001
            why = f"{type(e).__name__}: {' '.join(str(e).split())[:160]}"
        _reset_trackers(accelerator)
    say(f"warning: W&B could not start even offline ({why}); training goes on without W&B", flush=True)
    accelerator.log_with = [t for t in accelerator.log_with if str(t) != "wandb"]
    accelerator.init_trackers(project, init_kwargs={k: v for k, v in init.items() if k != "wandb"}, config=config)


def _raised_in_wandb(e: BaseException) -> bool:
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__", "").startswith("wandb"):
            return True
        tb = tb.tb_next
    return type(e).__module__.startswith("wandb")


def _reset_trackers(accelerator) -> None:
    """Close what a failed init_trackers started (TensorBoard's writer, W&B's half-made run)."""
    for t in accelerator.trackers:
        if t.name != "wandb" and getattr(t, "writer", None) is not None:
            t.finish()
    accelerator.trackers = []
    import wandb

    wandb.teardown()  # the failed run's id would be "in use" for the offline one


def resumed_line(ckpt, step: int, wrote, **now) -> str:
    """``resumed from CKPT at step N``, with what differs between the run that wrote the checkpoint
    (``wrote``, a RunInfo) and this run (``now``: field=value), e.g. ``(world_size: 1 -> 2)``."""
    changes = [f"{k}: {getattr(wrote, k)} -> {v}" for k, v in now.items() if getattr(wrote, k) != v]
    return f"resumed from {ckpt} at step {step}" + (f" ({'; '.join(changes)})" if changes else "")


def batch_change_warning(wrote, tokens_per_step: int, batch) -> str | None:
    """A resume whose optimizer step holds another number of tokens than the checkpoint's (another world size,
    micro-batch or accumulation) with no batch target that would have kept it (the LR schedule was tuned for the
    run's batch): one warning with the flag that keeps it. ``batch``: the config's BatchArgs."""
    before = getattr(wrote, "tokens_per_step", 0)
    if not before or before == tokens_per_step or batch.target_tokens_per_step or batch.target_effective_batch_size:
        return None
    return (f"warning: this resume changes the batch: {before:,} -> {tokens_per_step:,} tokens per optimizer step "
            f"(no batch target keeps it); to train on with the run's batch, resume with --target_tokens_per_step "
            f"{before}")


def val_set_warning(wrote, val_sequences: int, micro: int) -> str | None:
    """A resume whose validation set holds another number of sequences than the run's earlier evaluations (the
    eval batches are micro-batches: another micro-batch size or world size changes them): their val losses, and
    `best`, then compare different sets. One warning, with the --eval_steps that keeps the count where one does."""
    before = getattr(wrote, "val_sequences", 0)
    if not before or before == val_sequences:
        return None
    keep = f"; --eval_steps {before // micro} keeps it" if before % micro == 0 else ""
    return (f"warning: this resume evaluates on {val_sequences} validation sequences, the run's earlier evaluations "
            f"on {before} (eval_steps x micro_batch_size): val losses before and after it, and `best`, compare "
            f"different sets{keep}")


_SCHEDULE_FLAGS = {"max_lr": "max_lr", "min_lr_ratio": "min_lr_ratio", "warmup_steps": "warmup_steps",
                   "decay_steps": "lr_decay_steps"}


def schedule_change_warning(before: dict | None, now: dict, step: int) -> str | None:
    """A resume whose LR schedule (`schedule.schedule_of`: ``before`` from the checkpoint's config.yaml, None
    without one) differs from the run's, e.g. a longer ``--max_steps`` with no ``lr_decay_steps``, which moves the
    cosine and jumps the LR back up: one warning with the LR of the first step it trains both ways and the flags
    that keep the run's schedule. ``step``: the checkpoint's; the next update is step ``step + 1``, run at
    ``lr_at(step)``, as the console numbers it (docs/batching.md)."""
    if not before or before == now:
        return None
    changed = [k for k in now if before[k] != now[k]]
    changes = "; ".join(f"{_SCHEDULE_FLAGS[k]}: {before[k]} -> {now[k]}" for k in changed)
    keep = " ".join(f"--{_SCHEDULE_FLAGS[k]} {before[k]}" for k in changed)
    return (f"warning: this resume changes the LR schedule ({changes}): step {step + 1} trains at lr "
            f"{lr_at(step, **now):.3e}, the run's schedule gave {lr_at(step, **before):.3e}; {keep} keeps the "
            "run's schedule")


# How a run is watched and kept, set once at its start: a resume that leaves them out takes the defaults
# (a run saved every 10 steps then saves every 100), so the ones that differ are said. eval_steps: val_set_warning.
WATCH_AND_KEEP = ("log_freq", "eval_freq", "checkpoint_freq", "keep_last", "save_final", "sample_tokens",
                  "use_wandb", "use_tensorboard")


def settings_change_note(before: dict, now: dict) -> str | None:
    """The `WATCH_AND_KEEP` settings this resume changes from the checkpoint's config.yaml (``before``), with the
    flags that keep the run's."""
    changed = [k for k in WATCH_AND_KEEP if k in before and k in now and before[k] != now[k]]
    if not changed:
        return None
    return ("note: this resume watches and keeps the run otherwise than it did: "
            + ", ".join(f"{k} {before[k]} -> {now[k]}" for k in changed) + "; "
            + " ".join(f"--{k} {str(before[k]).lower() if isinstance(before[k], bool) else before[k]}"
                       for k in changed) + " keeps the run's")


def _saved_settings(ckpt) -> dict:
    try:
        flat = saved_config(ckpt)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):  # verified by its manifest; an older one may lack it
        return {}
    return flat if isinstance(flat, dict) else {}


def resume_warnings(wrote, tokens_per_step: int, batch, val_sequences: int, micro: int, ckpt, now: dict,
                    step: int) -> list[str]:
    """What a resume from ``ckpt`` (at ``step``) changes that the run's numbers depend on: its batch, its
    validation set, its LR schedule, how it is watched and kept (``now``: this run's flat config); and an
    ``init_from`` it does not use (the checkpoint's weights replace it)."""
    before = _saved_settings(ckpt)
    try:
        schedule = schedule_of(before)
    except (KeyError, TypeError):  # a config.yaml without the schedule's keys: nothing to compare
        schedule = None
    init_from = (f"note: init_from {now['init_from']} is not used: the run resumes from {ckpt} (init_from starts "
                 "a new run)") if now.get("init_from") else None
    found = (batch_change_warning(wrote, tokens_per_step, batch), val_set_warning(wrote, val_sequences, micro),
             schedule_change_warning(schedule, schedule_of(now), step), settings_change_note(before, now), init_from)
    return [w for w in found if w]


def run_summary(state, first_loss, last_loss, precision: str, wall_time_s: float, run_dir,
                logged_steps: int | None = None, last_logged_step: int | None = None) -> dict[str, Any]:
    """What `train()` returns and ``summary.json`` holds (``logged_steps``: of this session, first to last loss;
    ``last_logged_step``: the step of ``last_loss``)."""
    return {"steps": state.step, "tokens_seen": state.tokens_seen, "first_loss": first_loss, "last_loss": last_loss,
            "logged_steps": logged_steps, "last_logged_step": last_logged_step, "val_loss": state.val_loss,
            "best_val_loss": state.best_val_loss,
            "precision": precision, "wall_time_s": wall_time_s, "run_dir": str(run_dir)}


def write_summary(summary: dict[str, Any], run_dir: Path, say, max_steps: int | None = None) -> None:
    """``summary.json`` and the run's last console line (main process): ``done: ...`` when the run reached
    ``max_steps``, ``stopped at step N of M ...`` otherwise (a stop signal), with what this session did."""
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    say(summary_line(summary, max_steps))


def summary_line(summary: dict[str, Any], max_steps: int | None = None) -> str:
    steps, first, last, val = summary["steps"], summary["first_loss"], summary["last_loss"], summary["val_loss"]
    head = "done: " if max_steps is None or steps >= max_steps else \
        f"stopped at step {steps} of {max_steps} (checkpoint saved; the same command with --resume latest " \
        f"--output_dir {shlex.quote(str(summary['run_dir']))} continues): "
    loss = "no step trained in this session" if first is None else f"loss {first:.6f} -> {last:.6f}"
    if first is not None and summary.get("logged_steps") == 1:  # e.g. a short resume at a long log_freq
        loss = f"loss {last:.6f} (the one step logged in this session)"
    at = summary.get("last_logged_step")
    if first is not None and at is not None and at != steps:  # a stop between two logged steps: not step N's loss
        loss += f" (step {at}, the last logged)"
    return (f"{head}{steps} steps, {summary['tokens_seen']:,} tokens in {summary['wall_time_s']:.1f}s; {loss}; "
            + ("no validation loss yet" if val is None else f"val_loss {val:.6f}"))
