"""`yxanul sweep FILE [--count N] [--sweep_id ID] [--offline] [--summary] [--any_config_key value ...]`.

W&B sweeps over any yxanul config key (docs/sweeps.md). Online when a W&B key is configured (W&B's
server proposes the trials, ``wandb.agent`` runs them); offline with ``--offline``, ``WANDB_MODE``
offline/disabled, no key, or no wandb installed (grid and random run here; bayes runs as random).
Each trial is a normal `yxanul train` run in its own run directory; flags that are not the sweep's
own (e.g. ``--max_steps 20``, ``--config BASE.yaml``) go to every trial.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..config import _fields
from ..errors import ConfigError, UserError
from ..flags import _is_list, bare_booleans, fields_of, parse_command, strip_optional, underscored
from ..run_lock import DirLock
from .local import plan, run_offline, sweep_dir
from .online import run_online
from .report import summarize
from .spec import load_spec


@dataclass
class SweepCommand:
    """Run a W&B sweep file: online with wandb.agent, or offline here (grid/random), resumably."""

    file: str = field(metadata={"help": "Sweep file in W&B's format (sweeps/*.yaml).", "positional": True})
    count: int | None = field(default=None, metadata={"help": "Trials: online, how many this agent runs; offline, "
                                                               "the sweep's total (grid: the first N; random/bayes: "
                                                               "needed)."})
    sweep_id: str | None = field(default=None, metadata={"help": "Join this W&B sweep instead of creating one "
                                                                  "(more agents on one sweep)."})
    offline: bool = field(default=False, metadata={"help": "Run the trials here without W&B's server."})
    summary: bool = field(default=False, metadata={"help": "Only print the table and write best.json and the PNGs "
                                                            "of an offline sweep."})
    output_root: str = field(default="runs", metadata={"help": "Trials go to OUTPUT_ROOT/sweeps/<sweep>/<trial>/."})
    sweep_seed: int = field(default=0, metadata={"help": "Seed of the offline random search (same seed, same "
                                                          "trials: needed to resume)."})

    def __post_init__(self):
        if self.count is not None and self.count < 1:
            raise ConfigError("count", "an integer >= 1", self.count)
        if not Path(self.file).is_file():
            raise UserError(f"yxanul sweep: sweep file '{self.file}': no such file")


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the sweep's own flags and FILE, the rest: yxanul config flags, with their values, for every trial)."""
    fields = fields_of(SweepCommand)
    bools = {n for n, (f, tp) in fields.items() if strip_optional(tp)[0] is bool}
    lists = {k for k, (_, _, tp) in _fields().items() if _is_list(strip_optional(tp)[0])}
    own: list[str] = []
    rest: list[str] = []
    target, values = own, 0  # where the next values go, and how many (-1: until the next flag)
    for t in bare_booleans(underscored(list(argv), set(fields) | set(_fields())), bools):
        if t == "--":  # `yxanul sweep FILE -- --max_steps 20`: a separator before the trials' flags, not a flag
            continue
        if t.startswith("-"):
            name = t.lstrip("-").split("=", 1)[0]
            target = own if name in fields or name in ("h", "help") else rest
            target.append(t)
            values = 0 if "=" in t or name in ("h", "help") else -1 if name in lists else 1
        elif values:
            target.append(t)
            values -= 1 if values > 0 else 0
        else:
            own.append(t)  # the positional FILE
    return own, rest


def is_offline(args: SweepCommand) -> tuple[bool, str]:
    """Offline, and why."""
    if args.offline:
        return True, "--offline"
    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun"):
        return True, f"WANDB_MODE={os.environ['WANDB_MODE']}"
    if importlib.util.find_spec("wandb") is None:
        return True, "wandb is not installed"
    if not (os.environ.get("WANDB_API_KEY") or (Path.home() / ".netrc").is_file()):
        return True, "no W&B API key (wandb login)"
    return False, ""


def main(argv: list[str] | None = None, client=None) -> int:
    """``client``: the ``wandb`` module (tests pass a recording stand-in)."""
    own, overrides = split_argv(list(argv or []))
    args = parse_command(SweepCommand, own, prog="yxanul sweep", description=(
        f"{SweepCommand.__doc__} Any other flag (a `yxanul train` config key: --max_steps 20, --config BASE.yaml) "
        "goes to every trial. docs/sweeps.md"))
    spec = load_spec(args.file)
    offline, why = (True, "--summary") if args.summary else is_offline(args)
    if args.summary:
        summarize(sweep_dir(spec, args.output_root))
        return 0
    if not offline:
        if client is None:
            import wandb as client

        return run_online(client, spec, args.sweep_id, args.count, args.output_root, overrides)
    if args.sweep_id:
        raise UserError(f"yxanul sweep: --sweep_id needs W&B online, but the sweep is offline ({why})")
    print(f"sweep {spec.name}: offline ({why}), method {spec.method}, metric {spec.metric} ({spec.goal})")

    # one sweep process per sweep directory (each trial's own run-directory lock covers its training)
    with DirLock(sweep_dir(spec, args.output_root), "sweep directory"):
        root, trials = plan(spec, args.output_root, overrides, args.count, args.sweep_seed)
        rc = run_offline(spec, root, trials, args.sweep_seed)
        summarize(root)
    return rc
