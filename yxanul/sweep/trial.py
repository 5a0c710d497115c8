"""One sweep trial: a normal `yxanul train` run in its own run directory, as a subprocess.

A subprocess (not `train()` in-process) so that the trial's config reaches every rank when the
sweep's ``command`` starts with ``accelerate launch`` (the parameters are command-line flags, which
every rank parses), and so that a trial's crash, memory or CUDA state never leaks into the next one.
Every trial runs with ``--resume auto``: a trial that was interrupted continues from its last
checkpoint, a new one starts from scratch.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checkpoint.io import saved_config
from ..config import parse_args
from ..config_file import with_default_config
from ..errors import UserError
from ..training import speed_defaults
from .spec import SweepSpec, _flag_value, trial_flags

RESERVED = ("output_dir", "run_name", "resume")  # the sweep sets these for every trial
# where the runs are logged, not how they train: a rerun under another W&B project continues its trials
WHERE_LOGGED = ("wandb_project", "wandb_entity")


@dataclass
class Trial:
    """A trial: its id, parameters, run directory and the full command that runs it."""

    id: str
    params: dict[str, Any]  # as the sweep proposed them
    run_dir: Path
    argv: list[str]  # `yxanul train` flags (without the launcher)
    max_steps: int
    config: dict[str, Any]  # the same keys, as the trial runs them (after the user's override flags)
    # every config key as the trial runs it, but the speed flags the table sets at run time (a resume keeps them)
    settings: dict[str, Any] = field(default_factory=dict)

    def changed_settings(self) -> list[str]:
        """``key: before -> now`` for each setting that differs from the run directory's config.yaml (what
        the trial ran with before); empty for a trial that never started."""
        before = saved_config(self.run_dir)
        return [f"{k}: {before.get(k)!r} -> {v!r}" for k, v in self.settings.items()
                if k not in RESERVED + WHERE_LOGGED and k in before and before[k] != v]

    def status(self) -> str:
        """'done' (summary.json with all steps), 'partial' (checkpoints, not done) or 'new'."""
        summary = self.run_dir / "summary.json"
        if summary.is_file():
            try:
                if json.loads(summary.read_text()).get("steps", 0) >= self.max_steps:
                    return "done"
            except json.JSONDecodeError:
                pass
        return "partial" if (self.run_dir / "checkpoints").is_dir() else "new"


def split_overrides(overrides: list[str], spec: SweepSpec) -> tuple[str | None, list[str]]:
    """`--config FILE` out of the user's extra flags; refuse flags the sweep owns or sweeps."""
    base = _flag_value(overrides, "config")
    configs = [t for t in overrides if t == "--config" or t.startswith("--config=")]
    if len(configs) > 1:  # only the first would be read, silently
        raise UserError("yxanul sweep: --config given twice: give one base config")
    rest, skip = [], False
    for t in overrides:
        if skip:
            skip = False
            continue
        name = t[2:].split("=", 1)[0] if t.startswith("--") else None
        if name == "config":
            skip = "=" not in t
            continue
        if name in RESERVED:
            raise UserError(f"yxanul sweep: --{name} is set by the sweep for each trial (choose --output_root)")
        if name in spec.swept:
            raise UserError(f"yxanul sweep: --{name} is swept by '{spec.path}'; remove the flag or the parameter")
        rest.append(t)
    return base or spec.base_config(), rest


def make_trial(spec: SweepSpec, trial_id: str, params: dict[str, Any], run_dir: Path, overrides: list[str],
               extra: list[str] = ()) -> Trial:
    """Resolve the trial's config now (a bad value is one line before anything runs)."""
    base, rest = split_overrides(overrides, spec)
    fixed = [t for t in _without_config(spec.fixed)]
    argv = (["--config", base] if base else []) + fixed + trial_flags(params) + list(extra) + rest
    cfg = parse_args(with_default_config(argv))  # validates; ConfigError names the key
    argv += ["--output_dir", str(run_dir), "--run_name", trial_id, "--resume", "auto"]
    flat = cfg.to_flat_dict()
    # the speed flags a user left to the table are decided at run time (and a resume keeps the run's own)
    settings = {k: v for k, v in flat.items() if k in cfg.user_keys or k not in speed_defaults.TABLE_KEYS}
    return Trial(trial_id, params, run_dir, argv, cfg.train.max_steps, {k: flat[k] for k in params}, settings)


def _without_config(tokens: list[str]) -> list[str]:
    out, skip = [], False
    for t in tokens:
        if skip:
            skip = False
        elif t == "--config":
            skip = True
        elif not t.startswith("--config="):
            out.append(t)
    return out




def launch_command(spec: SweepSpec, trial: Trial) -> list[str]:
    """The process to start: `python -m yxanul train ...`, or under the sweep command's
    `accelerate launch [its flags]` (as `-m yxanul train`, so no repository path is needed)."""
    launcher = spec.launcher
    if launcher[:2] == ["accelerate", "launch"]:
        return [sys.executable, "-m", "accelerate.commands.launch", *launcher[2:], "-m", "yxanul", "train",
                *trial.argv]
    if launcher and Path(launcher[0]).name not in ("python", "python3"):
        raise UserError(f"sweep file '{spec.path}': command: yxanul sweep runs `yxanul train`, `train.py` or "
                        f"`accelerate launch ... train.py`, not {' '.join(launcher)!r}")
    return [sys.executable, "-m", "yxanul", "train", *trial.argv]


def run_trial(cmd: list[str], env: dict[str, str], log_path: Path, prefix: str,
              on_start: Callable[[subprocess.Popen], None] | None = None, forward_signals: bool = True
              ) -> tuple[int, bool]:
    """Run ``cmd``; its output goes to the console (prefixed) and to ``log_path`` (appended, so a
    resumed trial keeps the first part). SIGTERM/SIGUSR1 are forwarded: the trainer checkpoints and
    exits 0 (yxanul.training.preemption). Returns (exit code, whether a stop signal came)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(cmd, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    if on_start:
        on_start(proc)
    # only the main thread may set handlers (wandb.agent runs trials in a thread): online, the sweep forwards
    own = forward_signals and threading.current_thread() is threading.main_thread()
    forwarded = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)} if own else {}
    stopped: list[int] = []

    def forward(signum, _frame):
        stopped.append(signum)
        print(f"{prefix} received {signal.Signals(signum).name}: asking the trial to checkpoint and exit", flush=True)
        proc.send_signal(signum)

    for s in forwarded:
        signal.signal(s, forward)
    try:
        with open(log_path, "a") as log:
            for line in proc.stdout:  # type: ignore[union-attr]
                log.write(line)
                sys.stdout.write(f"{prefix} {line}")
                sys.stdout.flush()
        return proc.wait(), bool(stopped)
    finally:
        for s, h in forwarded.items():
            signal.signal(s, h)
        if proc.poll() is None:  # interrupted (Ctrl-C): stop the trial too
            proc.terminate()
            proc.wait(timeout=120)
