"""Online sweep: W&B's server proposes the trials (grid, random or bayes), ``wandb.agent`` asks for them.

``yxanul sweep FILE`` creates the sweep with ``wandb.sweep(config)`` (or joins ``--sweep_id``) and
runs ``wandb.agent(sweep_id, function, count)``. For each trial the agent sets ``WANDB_RUN_ID``,
``WANDB_SWEEP_ID`` and ``WANDB_SWEEP_PARAM_PATH`` (the trial's parameters, the file ``wandb.init``
turns into ``wandb.config``) and calls our function, which starts the trial as a normal yxanul run
with that environment: the trainer's ``wandb.init`` (through accelerate) then *is* the sweep's run.

Why the function does not call ``wandb.init()`` itself to read ``wandb.config``: the run would then be
open in the agent process and in the trial process at once (two writers of one run); reading the
same parameter file that ``wandb.init`` reads gives the same values with one writer.

Preemption: SIGTERM/SIGUSR1 go to the running trial (it checkpoints and exits 0) and stop the agent
(W&B's agent runs trials in a thread; it stops on KeyboardInterrupt). The trial directory keeps
``sweep_trial.json``; the next `yxanul sweep` of the same sweep (e.g. the requeued SLURM task)
resumes such trials first, under the same W&B run id, so the run stays in its sweep.

``client`` is the ``wandb`` module; tests pass a stand-in that records what yxanul sends.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import yaml

from ..errors import UserError, first_line
from .spec import SweepSpec, _flag_value
from .trial import launch_command, make_trial, run_trial

MARKER = "sweep_trial.json"


def trial_params(param_path: str) -> dict[str, Any]:
    """The parameters W&B's agent wrote for this trial (``{key: {value: v}}`` + ``wandb_version``)."""
    data = yaml.safe_load(Path(param_path).read_text()) or {}
    return {k: v["value"] for k, v in data.items() if isinstance(v, dict) and "value" in v}


def agent_owner() -> str | None:
    """Who runs this agent across a requeue: the SLURM (array) task, or YXANUL_SWEEP_AGENT."""
    if os.environ.get("YXANUL_SWEEP_AGENT"):
        return os.environ["YXANUL_SWEEP_AGENT"]
    if os.environ.get("SLURM_ARRAY_JOB_ID"):
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID', '0')}"
    return os.environ.get("SLURM_JOB_ID")


class OnlineSweep:
    """One agent's trials of one W&B sweep, under ``OUTPUT_ROOT/sweeps/<sweep id>/<run id>/``."""

    def __init__(self, client, spec: SweepSpec, output_root: str, overrides: list[str], say=print):
        self.client, self.spec, self.overrides, self.say = client, spec, overrides, say
        self.project = _flag_value(overrides, "wandb_project") or spec.project or "yxanul"
        self.entity = _flag_value(overrides, "wandb_entity") or spec.entity
        self.output_root = Path(output_root)
        self.sweep_id = ""
        self.proc = None  # the running trial
        self.stopped = False
        self.in_agent = False  # inside wandb.agent (a stop raises KeyboardInterrupt there)
        self.failures: list[str] = []

    @property
    def root(self) -> Path:
        return self.output_root / "sweeps" / self.sweep_id.split("/")[-1]

    def create_or_join(self, sweep_id: str | None) -> str:
        if sweep_id:
            self.say(f"sweep: joining W&B sweep {sweep_id} (project {self.project})")
        else:
            try:
                sweep_id = self.client.sweep(sweep=self.spec.raw, project=self.project, entity=self.entity)
            except Exception as e:  # noqa: BLE001 - W&B's auth/network errors: one line (`yxanul train` goes offline)
                raise UserError(unreachable("the W&B sweep could not be created", e, self.spec.path)) from None
            self.say(f"sweep: created W&B sweep {sweep_id} (project {self.project}); more agents: "
                     f"yxanul sweep {self.spec.path} --sweep_id {sweep_id}")
        self.sweep_id = sweep_id
        return sweep_id

    def run(self, run_id: str, param_path: Path) -> None:
        """One trial (new or resumed) with the W&B run id the agent handed out."""
        run_dir = self.root / run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        if param_path != run_dir / "sweep_params.yaml":  # keep the agent's file: a resume needs it
            shutil.copyfile(param_path, run_dir / "sweep_params.yaml")
        params = trial_params(str(run_dir / "sweep_params.yaml"))
        t = make_trial(self.spec, run_id, params, run_dir, self.overrides,
                       extra=["--use_wandb=true", f"--wandb_project={self.project}"])
        marker = {"run_id": run_id, "sweep_id": self.sweep_id, "params": params, "owner": agent_owner(),
                  "status": "running"}
        (run_dir / MARKER).write_text(json.dumps(marker))
        env = dict(os.environ, WANDB_RUN_ID=run_id, WANDB_SWEEP_ID=self.sweep_id.split("/")[-1],
                   WANDB_SWEEP_PARAM_PATH=str((run_dir / "sweep_params.yaml").absolute()),
                   WANDB_RESUME="allow", WANDB_PROJECT=self.project, WANDB_DIR=str(run_dir))  # agent sets it to cwd
        if self.entity:
            env["WANDB_ENTITY"] = self.entity
        self.say(f"sweep {self.sweep_id}: trial {run_id} {params} in {run_dir}")
        rc, _ = run_trial(launch_command(self.spec, t), env, run_dir / "train.log", f"[{run_id}]",
                          on_start=lambda p: setattr(self, "proc", p), forward_signals=False)
        self.proc = None
        marker["status"] = "done" if t.status() == "done" else "interrupted" if self.stopped else "failed"
        (run_dir / MARKER).write_text(json.dumps(marker))
        if rc != 0:
            self.failures.append(run_id)
            raise UserError(f"trial {run_id} exited with code {rc} (log {run_dir / 'train.log'})")

    def agent_trial(self) -> None:
        """The function wandb.agent calls once per trial, with the trial's W&B environment set."""
        self.run(os.environ["WANDB_RUN_ID"], Path(os.environ["WANDB_SWEEP_PARAM_PATH"]))

    def resumable(self) -> list[str]:
        """Trials of this sweep left unfinished by a stop signal, or by this same (requeued) agent."""
        me, out = agent_owner(), []
        for m in sorted(self.root.glob(f"*/{MARKER}")) if self.root.is_dir() else []:
            info = json.loads(m.read_text())
            if info["status"] == "interrupted" or (info["status"] == "running" and me and info["owner"] == me):
                claim = m.with_name(f"{MARKER}.{os.getpid()}")
                try:  # one agent takes it: rename is atomic, the others no longer see the marker
                    os.rename(m, claim)
                except OSError:
                    continue
                m.write_text(json.dumps({**info, "status": "running", "owner": me}))
                claim.unlink()
                out.append(info["run_id"])
        return out

    def stop(self, signum, _frame) -> None:
        self.say(f"sweep {self.sweep_id}: {signal.Signals(signum).name}: the trial checkpoints, the agent stops")
        self.stopped = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)
        if self.in_agent:
            raise KeyboardInterrupt  # how wandb.agent is told to take no further trial


def unreachable(what: str, e: Exception, path: str) -> str:
    return (f"{what} ({type(e).__name__}: {first_line(e)[:200]}); check WANDB_API_KEY and that W&B can be reached, "
            f"or run the trials here without W&B: yxanul sweep {path} --offline")


def run_online(client, spec: SweepSpec, sweep_id: str | None, count: int | None, output_root: str,
               overrides: list[str], say=print) -> int:
    """Create/join the sweep, resume this agent's interrupted trials, then run ``wandb.agent`` for the
    rest of ``count`` trials (None: until the sweep is done)."""
    sweep = OnlineSweep(client, spec, output_root, overrides, say)
    sweep.create_or_join(sweep_id)
    old = {s: signal.signal(s, sweep.stop) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        resumed = sweep.resumable()
        for run_id in resumed:
            if sweep.stopped:  # hand it back for the next start
                m = sweep.root / run_id / MARKER
                m.write_text(json.dumps({**json.loads(m.read_text()), "status": "interrupted"}))
                continue
            say(f"sweep {sweep.sweep_id}: resuming interrupted trial {run_id} (same W&B run)")
            sweep.run(run_id, sweep.root / run_id / "sweep_params.yaml")
        left = None if count is None else count - len(resumed)
        if not sweep.stopped and (left is None or left > 0):
            sweep.in_agent = True
            client.agent(sweep.sweep_id, function=sweep.agent_trial, count=left, project=sweep.project,
                         entity=sweep.entity)
    except KeyboardInterrupt:
        if not sweep.stopped:
            raise
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - the agent's W&B errors (joining, asking for a trial): one line
        raise UserError(unreachable(f"the W&B agent of sweep {sweep.sweep_id} stopped", e, spec.path)) from None
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if sweep.stopped:
        say(f"sweep {sweep.sweep_id}: stopped; the same command resumes the interrupted trial")
        return 0
    say(f"sweep {sweep.sweep_id}: agent done" + (f", {len(sweep.failures)} trial(s) failed" if sweep.failures else ""))
    return 1 if sweep.failures else 0
