"""Online sweep: W&B's server proposes the trials (grid, random or bayes), ``wandb.agent`` asks for them.

``yxanul sweep FILE`` creates the sweep with ``wandb.sweep(config)`` (or joins ``--sweep_id``) and
runs ``wandb.agent(sweep_id, function, count)``. For each trial the agent sets ``WANDB_RUN_ID``,
``WANDB_SWEEP_ID`` and ``WANDB_SWEEP_PARAM_PATH`` (the trial's parameters, the file ``wandb.init``
turns into ``wandb.config``) and calls our function, which starts the trial as a normal yxanul run
with that environment: the trainer's ``wandb.init`` (through accelerate) then *is* the sweep's run.

Why the function does not call ``wandb.init()`` itself to read ``wandb.config``: the run would then be
open in the agent process and in the trial process at once (two writers of one run); reading the
same parameter file that ``wandb.init`` reads gives the same values with one writer.

``client`` is the ``wandb`` module; tests pass a stand-in that records what yxanul sends.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from ..errors import UserError
from .spec import SweepSpec
from .trial import launch_command, make_trial, run_trial


def trial_params(param_path: str) -> dict[str, Any]:
    """The parameters W&B's agent wrote for this trial (``{key: {value: v}}`` + ``wandb_version``)."""
    data = yaml.safe_load(Path(param_path).read_text()) or {}
    return {k: v["value"] for k, v in data.items() if isinstance(v, dict) and "value" in v}


def project_of(spec: SweepSpec, overrides: list[str]) -> str:
    from .spec import _flag_value

    return _flag_value(overrides, "wandb_project") or spec.project or "yxanul"


def create_or_join(client, spec: SweepSpec, sweep_id: str | None, project: str, entity: str | None, say=print) -> str:
    if sweep_id:
        say(f"sweep: joining W&B sweep {sweep_id} (project {project})")
        return sweep_id
    sweep_id = client.sweep(sweep=spec.raw, project=project, entity=entity)
    say(f"sweep: created W&B sweep {sweep_id} (project {project}); more agents: "
        f"yxanul sweep {spec.path} --sweep_id {sweep_id}")
    return sweep_id


def run_online(client, spec: SweepSpec, sweep_id: str | None, count: int | None, output_root: str,
               overrides: list[str], say=print) -> int:
    """Create/join the sweep and run an agent for ``count`` trials (None: until the sweep ends)."""
    from .spec import _flag_value

    project = project_of(spec, overrides)
    entity = _flag_value(overrides, "wandb_entity") or spec.entity
    sweep_id = create_or_join(client, spec, sweep_id, project, entity, say)
    root = Path(output_root) / "sweeps" / sweep_id.split("/")[-1]
    failures: list[str] = []

    def trial() -> None:
        """Called by wandb.agent once per trial, with the trial's W&B environment set."""
        run_id = os.environ["WANDB_RUN_ID"]
        params = trial_params(os.environ["WANDB_SWEEP_PARAM_PATH"])
        t = make_trial(spec, run_id, params, root / run_id, overrides,
                       extra=["--use_wandb=true", f"--wandb_project={project}"])
        env = dict(os.environ, WANDB_RESUME="allow", WANDB_PROJECT=project,
                   WANDB_SWEEP_PARAM_PATH=str(Path(os.environ["WANDB_SWEEP_PARAM_PATH"]).absolute()))
        if entity:
            env["WANDB_ENTITY"] = entity
        say(f"sweep {sweep_id}: trial {run_id} {params} in {t.run_dir}")
        rc, _ = run_trial(launch_command(spec, t), env, t.run_dir / "train.log", f"[{run_id}]")
        if rc != 0:
            failures.append(run_id)
            raise UserError(f"trial {run_id} exited with code {rc} (log {t.run_dir / 'train.log'})")

    client.agent(sweep_id, function=trial, count=count, project=project, entity=entity)
    say(f"sweep {sweep_id}: agent done" + (f", {len(failures)} trial(s) failed" if failures else ""))
    return 1 if failures else 0
