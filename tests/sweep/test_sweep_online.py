"""The online path (`wandb.sweep` + `wandb.agent`) with W&B's network replaced by a stand-in that
records what yxanul passes and, per trial, does what W&B's agent does (wandb/agents/pyagent.py:
WANDB_RUN_ID, WANDB_SWEEP_ID and the parameter file WANDB_SWEEP_PARAM_PATH, then the function).
The trial is real: a few steps of `yxanul train`, whose W&B run (offline here) takes the agent's id."""

import os
from pathlib import Path

import pytest
import yaml

from yxanul.sweep import main
from yxanul.sweep.online import run_online
from yxanul.sweep.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "sweeps" / "penalty_weight_tinyshakespeare.yaml"
PRESET = "tiny"
FAST = ["--model", PRESET, "--seq_length", "32", "--micro_batch_size", "4", "--eval_steps", "1",
        "--sample_tokens", "0", "--use_tensorboard", "false", "--num_workers", "0", "--max_steps", "2",
        "--eval_freq", "2", "--checkpoint_freq", "0"]


class RecordingWandb:
    """Stands in for the `wandb` module: the calls yxanul makes, and the agent's per-trial protocol."""

    def __init__(self, tmp: Path, proposals: list[dict]):
        self.tmp, self.proposals, self.calls = tmp, proposals, []

    def sweep(self, sweep, project=None, entity=None):
        self.calls.append(("sweep", sweep, project, entity))
        return "sw3ep1d"

    def agent(self, sweep_id, function=None, count=None, project=None, entity=None):
        from wandb.sdk.lib import config_util  # the real file format the agent writes

        self.calls.append(("agent", sweep_id, count, project, entity))
        for i, params in enumerate(self.proposals[:count]):
            run_id = f"run{i}abc"
            path = self.tmp / "wandb" / f"sweep-{sweep_id}" / f"config-{run_id}.yaml"
            config_util.save_config_file_from_dict(str(path), {k: {"value": v} for k, v in params.items()})
            os.environ.update(WANDB_RUN_ID=run_id, WANDB_SWEEP_ID=sweep_id, WANDB_SWEEP_PARAM_PATH=str(path))
            try:
                function()
            finally:
                for k in ("WANDB_RUN_ID", "WANDB_SWEEP_ID", "WANDB_SWEEP_PARAM_PATH"):
                    os.environ.pop(k, None)


@pytest.mark.slow
def test_online_sweep_creates_runs_agent_and_trial_joins_the_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("YXANUL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_MODE", "offline")  # the trial's own W&B run: offline files, no network
    monkeypatch.chdir(tmp_path)
    spec = load_spec(str(SWEEP))
    proposal = {**{k: p["value"] for k, p in spec.parameters.items() if "value" in p}, "penalty_weight": 0.01}
    fake = RecordingWandb(tmp_path, [proposal, proposal])
    assert run_online(fake, spec, None, 1, str(tmp_path / "out"), FAST, say=lambda *a: None) == 0

    (_, sent, project, entity), agent = fake.calls
    assert sent == yaml.safe_load(SWEEP.read_text()) and project == "yxanul" and entity is None
    assert agent == ("agent", "sw3ep1d", 1, "yxanul", None)
    run = tmp_path / "out" / "sweeps" / "sw3ep1d" / "run0abc"
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["penalty_weight"] == 0.01 and cfg["penalty_type"] == "z_loss" and cfg["max_steps"] == 2
    assert cfg["use_wandb"] is True and cfg["wandb_project"] == "yxanul"
    (wb,) = (run / "wandb").glob("offline-run-*")
    assert wb.name.endswith("-run0abc")  # the trial's W&B run is the one the agent handed out
    assert not (tmp_path / "out" / "sweeps" / "sw3ep1d" / "run1abc").exists()  # count=1


def test_join_existing_sweep_does_not_create_one(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    fake = RecordingWandb(tmp_path, [])
    assert main([str(SWEEP), "--sweep_id", "ent/proj/abc", "--count", "2", "--output_root", str(tmp_path)],
                client=fake) == 0
    assert fake.calls == [("agent", "ent/proj/abc", 2, "yxanul", None)]
