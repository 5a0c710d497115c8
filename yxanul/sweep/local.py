"""Offline sweep: the sweep file's trials run one after another on this machine, resumably.

Layout: ``OUTPUT_ROOT/sweeps/<sweep-name>/`` holds ``sweep.json`` (the planned trials and their
status) and one run directory per trial (``trial-000/``, ...), each a normal yxanul run directory
(config.yaml, metrics.jsonl, checkpoints/, wandb/ offline files for ``wandb sync``, train.log).
Started again with the same command, a sweep skips finished trials and resumes an interrupted one
from its last checkpoint (every trial runs with ``--resume auto``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Any

from ..errors import UserError
from .spec import SweepSpec, plan_trials
from .trial import Trial, launch_command, make_trial, run_trial

STATE = "sweep.json"


def sweep_dir(spec: SweepSpec, output_root: str) -> Path:
    return Path(output_root) / "sweeps" / re.sub(r"[^A-Za-z0-9_.-]+", "-", spec.name)


def _wandb_installed() -> bool:
    return importlib.util.find_spec("wandb") is not None


def plan(spec: SweepSpec, output_root: str, overrides: list[str], count: int | None, seed: int,
         say=print) -> tuple[Path, list[Trial]]:
    """The trials of this sweep, checked against what an earlier start of it planned."""
    root = sweep_dir(spec, output_root)
    params = plan_trials(spec, count, seed)  # a random or bayes sweep without --count: one line first
    if spec.method == "bayes":
        say(f"sweep {spec.name}: method bayes needs W&B's server to propose trials from the results; "
            f"offline it runs as random search over the same parameters (--count {count} trials)")
    state_path = root / STATE
    if state_path.is_file():
        old = json.loads(state_path.read_text())
        for t, p in zip(old["trials"], params):
            if t["params"] != p:
                raise UserError(f"{root} holds another sweep (trial {t['id']}: {t['params']} != {p}): use the same "
                                f"file, --count and --sweep_seed as before, or another --output_root")
    # the file's project/entity (as online): W&B's default project would take every offline sweep's runs
    wandb = ["--use_wandb=true"] if _wandb_installed() else []
    extra = wandb + spec.logged_to()  # before the user's flags: a --wandb_project of theirs wins
    trials = [make_trial(spec, f"trial-{i:03d}", p, root / f"trial-{i:03d}", overrides, extra)
              for i, p in enumerate(params)]
    for t in trials:  # a started trial continues only under the settings it ran with
        if changed := t.changed_settings():
            raise UserError(f"{t.run_dir} ran with other settings ({'; '.join(changed)}): run the sweep with the same "
                            "flags as before, or choose another --output_root")
    if not wandb:
        say("wandb is not installed: trials log to metrics.jsonl and TensorBoard only "
            "(pip install 'yxanul[wandb]' for W&B offline files)")
    return root, trials


def write_state(root: Path, spec: SweepSpec, trials: list[Trial], seed: int, extra: dict[str, Any] | None = None):
    root.mkdir(parents=True, exist_ok=True)
    state = {"name": spec.name, "file": spec.path, "method": spec.method,
             "method_run": "random" if spec.method == "bayes" else spec.method, "metric": spec.metric,
             "goal": spec.goal, "seed": seed, "swept": spec.swept,
             "trials": [{"id": t.id, "params": t.params, "config": t.config, "run_dir": str(t.run_dir),
                         "status": t.status(), "argv": t.argv} for t in trials], **(extra or {})}
    tmp = root / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, root / STATE)


def run_offline(spec: SweepSpec, root: Path, trials: list[Trial], seed: int, say=print) -> int:
    """Run every trial that is not done. Returns 0, 1 (a trial failed) or 0 after a stop signal
    (the interrupted trial saved a checkpoint; start the same command again to continue)."""
    # WANDB_QUIET: W&B's end-of-run history and summary (a multi-line sample among them) per trial buried each
    # trial's own `done:` line; the sync command is said once at the end. A WANDB_QUIET of the user's wins.
    env = {"WANDB_QUIET": "true", **os.environ, "WANDB_MODE": "offline", "WANDB_RUN_GROUP": spec.name}
    failed = []
    write_state(root, spec, trials, seed)
    for t in trials:
        status = t.status()
        if status == "done":
            say(f"sweep {spec.name}: {t.id} {t.config} already finished, skipped")
            continue
        say(f"sweep {spec.name}: {t.id} {t.config}" + (" resuming from its last checkpoint" if status == "partial"
                                                        else ""))
        # a stable W&B run id per trial: a resumed trial writes to the same W&B run when synced
        trial_env = dict(env, WANDB_RUN_ID=f"{root.name}-{t.id}"[-64:], WANDB_DIR=str(t.run_dir))
        rc, stopped = run_trial(launch_command(spec, t), trial_env, t.run_dir / "train.log", f"[{t.id}]")
        write_state(root, spec, trials, seed)
        if stopped:
            say(f"sweep {spec.name}: stopped during {t.id} (checkpoint saved); run the same command to continue")
            return 0
        if rc != 0:
            say(f"sweep {spec.name}: {t.id} failed (exit code {rc}, log {t.run_dir / 'train.log'})")
            failed.append(t.id)
    if any(root.glob("*/wandb/offline-run-*")):
        say(f"sweep {spec.name}: W&B runs saved offline; upload them with: wandb sync {root}/*/wandb/offline-run-*")
    if failed:
        say(f"sweep {spec.name}: {len(failed)} trial(s) failed: {', '.join(failed)} (run the same command to retry)")
    return 1 if failed else 0
