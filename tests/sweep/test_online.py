"""The online path (`wandb.sweep` + `wandb.agent`) with W&B's network replaced by a stand-in that
records what yxanul passes and, per trial, does what W&B's agent does (wandb/agents/pyagent.py:
WANDB_RUN_ID, WANDB_SWEEP_ID and the parameter file WANDB_SWEEP_PARAM_PATH, then the function).
The trial is real: a few steps of `yxanul train`, whose W&B run (offline here) takes the agent's id;
stopped by SIGUSR1 (SLURM's warning), it checkpoints, and the next agent resumes it in the same run."""

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import yaml
from tiny_run import FAST

from yxanul.sweep import main
from yxanul.sweep.online import run_online
from yxanul.sweep.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "sweeps" / "penalty_weight_tinyshakespeare.yaml"
PRESET = "nano"
# every trial: the tiny run for 4 steps, validated at step 3, checkpoints every 2
TRIAL = [*FAST, "--eval_steps", "1", "--max_steps", "4", "--warmup_steps", "1", "--eval_freq", "3",
         "--checkpoint_freq", "2"]


class RecordingWandb:
    """Stands in for the `wandb` module: the calls yxanul makes, and the agent's per-trial protocol
    (like wandb.agents.pyagent: the function in a thread; KeyboardInterrupt stops the agent)."""

    def __init__(self, tmp: Path, proposals: list[dict], prefix: str = "run"):
        self.tmp, self.proposals, self.prefix, self.calls = tmp, proposals, prefix, []

    def sweep(self, sweep, project=None, entity=None):
        self.calls.append(("sweep", sweep, project, entity))
        return "sw3ep1d"

    def agent(self, sweep_id, function=None, count=None, project=None, entity=None):
        self.calls.append(("agent", sweep_id, count, project, entity))
        for i, params in enumerate(self.proposals[:count]):
            done = threading.Event()  # an Event, as pyagent: a join() interrupted by Ctrl-C misreports (< 3.13)
            threading.Thread(target=self._job, args=(sweep_id, f"{self.prefix}{i}abc", params, function, done)).start()
            try:
                done.wait()
            except KeyboardInterrupt:
                done.wait()
                return

    def _job(self, sweep_id, run_id, params, function, done):
        from wandb.sdk.lib import config_util  # the real file format the agent writes

        path = self.tmp / "wandb" / f"sweep-{sweep_id}" / f"config-{run_id}.yaml"
        config_util.save_config_file_from_dict(str(path), {k: {"value": v} for k, v in params.items()})
        os.environ.update(WANDB_RUN_ID=run_id, WANDB_SWEEP_ID=sweep_id, WANDB_SWEEP_PARAM_PATH=str(path))
        try:
            function()
        finally:
            for k in ("WANDB_RUN_ID", "WANDB_SWEEP_ID", "WANDB_SWEEP_PARAM_PATH"):
                os.environ.pop(k, None)
            done.set()


class UnreachableWandb(RecordingWandb):
    """W&B's own errors for a key the server refuses and a server that does not answer."""

    def sweep(self, sweep, project=None, entity=None):
        from wandb.errors import AuthenticationError

        raise AuthenticationError("API key verification failed\nstatus 401")

    def agent(self, sweep_id, function=None, count=None, project=None, entity=None):
        from wandb.errors import CommError

        raise CommError("Network error (ConnectTimeout), entering retry loop")


def test_a_wandb_that_refuses_or_cannot_be_reached_is_one_line_naming_offline(tmp_path):
    """Creating the sweep (wandb.sweep) or joining it (wandb.agent) when W&B says no: one line, exit 2, not a
    traceback called a bug; `yxanul train` in the same place logs offline, so the line says --offline."""
    pytest.importorskip("wandb")
    from yxanul.errors import UserError

    spec, client = load_spec(str(SWEEP)), UnreachableWandb(tmp_path, [])
    with pytest.raises(UserError, match=r"^the W&B sweep could not be created \(AuthenticationError: API key "
                                        r"verification failed\); check WANDB_API_KEY .* --offline$"):
        run_online(client, spec, None, 1, str(tmp_path), [], say=lambda *a, **k: None)
    with pytest.raises(UserError, match=r"^the W&B agent of sweep me/p/abc stopped \(CommError: Network error"):
        run_online(client, spec, "me/p/abc", 1, str(tmp_path), [], say=lambda *a, **k: None)


def _signal_when(path: Path, sig=signal.SIGUSR1):
    def watch():
        while not path.is_dir():
            time.sleep(0.05)
        os.kill(os.getpid(), sig)  # what SLURM's --signal does to the agent

    threading.Thread(target=watch, daemon=True).start()


@pytest.mark.slow
def test_online_sweep_trial_joins_the_run_and_a_preempted_trial_resumes_in_it(tmp_path, monkeypatch, capsys):
    pytest.importorskip("wandb")
    monkeypatch.setenv("YXANUL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_MODE", "offline")  # the trial's own W&B run: offline files, no network
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))  # pyagent sets it (to the cwd): trials still write in their dir
    monkeypatch.chdir(tmp_path)
    spec = load_spec(str(SWEEP))
    fixed = {k: p["value"] for k, p in spec.parameters.items() if "value" in p}
    props = [{**fixed, "penalty_weight": w} for w in (0.01, 0.001)]
    fake = RecordingWandb(tmp_path, props)
    root = tmp_path / "out" / "sweeps" / "sw3ep1d"
    _signal_when(root / "run0abc" / "checkpoints" / "step_2")
    assert run_online(fake, spec, None, 2, str(tmp_path / "out"), TRIAL) == 0  # stopped, rc 0 (requeue)

    (_, sent, project, entity), agent = fake.calls
    assert sent == yaml.safe_load(SWEEP.read_text()) and project == "yxanul" and entity is None
    assert agent == ("agent", "sw3ep1d", 2, "yxanul", None)
    run = root / "run0abc"
    assert json.loads((run / "sweep_trial.json").read_text())["status"] == "interrupted"
    assert not (root / "run1abc").exists()  # the stopped agent took no further trial
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["penalty_weight"] == 0.01 and cfg["penalty_type"] == "z_loss" and cfg["max_steps"] == 4
    assert cfg["use_wandb"] is True and cfg["wandb_project"] == "yxanul"
    stopped_at = json.loads((run / "summary.json").read_text())["steps"]
    assert 2 <= stopped_at < 4
    capsys.readouterr()

    again = RecordingWandb(tmp_path, [], prefix="new")  # records the agent call; no further trial (time)
    assert run_online(again, spec, "sw3ep1d", 2, str(tmp_path / "out"), TRIAL) == 0
    out = capsys.readouterr().out
    assert "resuming interrupted trial run0abc" in out and f"at step {stopped_at}" in out
    assert again.calls == [("agent", "sw3ep1d", 1, "yxanul", None)]  # 2 minus the resumed one
    assert json.loads((run / "summary.json").read_text())["steps"] == 4
    assert json.loads((run / "sweep_trial.json").read_text())["status"] == "done"
    wb = sorted(p.name for p in (run / "wandb").glob("offline-run-*"))
    assert len(wb) == 2 and all(n.endswith("-run0abc") for n in wb)  # both parts: the agent's run id


def test_join_existing_sweep_does_not_create_one(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    fake = RecordingWandb(tmp_path, [])
    assert main([str(SWEEP), "--sweep_id", "ent/proj/abc", "--count", "2", "--output_root", str(tmp_path)],
                client=fake) == 0
    assert fake.calls == [("agent", "ent/proj/abc", 2, "yxanul", None)]
    # the file's project and entity are its defaults: the training flags given to `yxanul sweep` win
    own = tmp_path / "own.yaml"
    own.write_text(yaml.safe_dump({**yaml.safe_load(SWEEP.read_text()), "project": "file-p", "entity": "file-e"}))
    fake = RecordingWandb(tmp_path, [])
    assert main([str(own), "--count", "1", "--output_root", str(tmp_path), "--wandb_project", "flag-p",
                 "--wandb_entity", "flag-e"], client=fake) == 0
    assert [c[2:] for c in fake.calls if c[0] == "sweep"] == [("flag-p", "flag-e")]
    fake = RecordingWandb(tmp_path, [])
    assert main([str(own), "--count", "1", "--output_root", str(tmp_path)], client=fake) == 0
    assert [c[2:] for c in fake.calls if c[0] == "sweep"] == [("file-p", "file-e")]
