"""Launch-level checks (issue 17 item 6) and the trainer guards' one-line stops, on their real functions."""

import json
import math
import os
from pathlib import Path

import pytest
import torch

from yxanul.errors import TrainingDiverged
from yxanul.lint import check_launch_environment
from yxanul.training.guards import CollapseGuard
from yxanul.training.launch import check_wandb_key

TORCHRUN_CPU = {"WORLD_SIZE": "2", "LOCAL_RANK": "0", "RANK": "0"}  # accelerate_configs/cpu.yaml without ..._USE_CPU


def _keys(problems, severity):
    return {p.key for p in problems if p.severity == severity}


def test_no_false_rank_0_of_1_warning_when_yxanul_forces_cpu():
    """yxanul's trainer builds its state with cpu=True: 2 torchrun'd ranks really are 2 (it warned they were not)."""
    assert check_launch_environment(TORCHRUN_CPU, cuda_available=False) == []
    other = check_launch_environment(TORCHRUN_CPU, cuda_available=False, forces_cpu=False)  # e.g. a plain script
    assert _keys(other, "warning") == {"ACCELERATE_USE_CPU"}
    assert check_launch_environment({**TORCHRUN_CPU, "ACCELERATE_USE_CPU": "1"}, cuda_available=False,
                                    forces_cpu=False) == []


def test_deepspeed_on_cpu_processes_is_no_error():
    """Several DeepSpeed processes train on CPU (gloo; tests/training/test_deepspeed.py), so the start-up check
    lets them through, with or without GPUs."""
    env = {"ACCELERATE_USE_DEEPSPEED": "true", "WORLD_SIZE": "8"}
    assert _keys(check_launch_environment(env, cuda_available=False), "error") == set()
    assert check_launch_environment(env, cuda_available=True) == []
    one = {"ACCELERATE_USE_DEEPSPEED": "true", "WORLD_SIZE": "1"}
    assert check_launch_environment(one, cuda_available=False) == []


def test_wandb_key_format_is_checked_at_start_offline():
    assert "40+ characters" in check_wandb_key(True, {"WANDB_API_KEY": "abc"})
    assert "whitespace" in check_wandb_key(True, {"WANDB_API_KEY": "a" * 40 + "\n"})
    assert check_wandb_key(True, {"WANDB_API_KEY": "a" * 40}) is None
    assert check_wandb_key(True, {"WANDB_API_KEY": "abc", "WANDB_MODE": "offline"}) is None
    assert check_wandb_key(True, {"WANDB_API_KEY": "abc", "WANDB_MODE": "dryrun"}) is None  # wandb's old offline
    assert check_wandb_key(False, {"WANDB_API_KEY": "abc"}) is None


def test_collapse_guard_counts_zero_norms_and_refuses_a_save():
    g = CollapseGuard(patience=3)
    for step, norm in enumerate([0.5, 0.0, 0.0, 1.0, 0.0, 0.0]):
        g.observe(step, norm)  # never 3 zeros in a row
    with pytest.raises(TrainingDiverged, match="gradient norm 0 at 3 logged steps in a row: the model has collapsed"):
        g.observe(6, 0.0)
    with pytest.raises(TrainingDiverged, match="gradient norm inf"):
        CollapseGuard().observe(1, math.inf)
    with pytest.raises(TrainingDiverged, match="gradient norm nan"):
        CollapseGuard().observe(1, math.nan)
    with pytest.raises(TrainingDiverged, match="at a checkpoint step"):
        CollapseGuard().before_save(4, 0.0)
    with pytest.raises(TrainingDiverged, match="step 4: loss or gradient norm is not finite; .* in run/checkpoints"):
        CollapseGuard().before_save(4, 0.1, loss_finite=False, run_dir="run")  # a finite norm does not hide it
    with pytest.raises(TrainingDiverged, match="not finite"):
        CollapseGuard().before_save(4, math.nan)
    CollapseGuard().before_save(4, 0.1)
    CollapseGuard().before_save(4, None)  # no optimizer step yet


class _NaNAfterSave:
    """A model that turns non-finite between two evaluations: after the step's checkpoint, its final norm
    is NaN (through the callback API: the training loop itself stays real)."""

    def on_save(self, trainer, ckpt_dir, is_best):
        with torch.no_grad():
            trainer.unwrapped_model.model.norm.weight.fill_(float("nan"))


def test_non_finite_val_loss_stops_before_sampling(tmp_path):
    """Through the real `fit()` loop: evaluation at step 2 (finite, a sample), checkpoint, then the model
    turns NaN; nothing is logged at steps 3-4, so the step 4 evaluation's validation loss is the first
    check. It stops there with one line (TrainingDiverged, exit 3), before the sample (torch.multinomial
    would fail on NaN probabilities) and before step 4's checkpoint: step 2 stays `latest`."""
    from safetensors.torch import load_file

    from yxanul.config import parse_args
    from yxanul.training import train

    out = tmp_path / "run"
    cfg = parse_args(["--model", "nano", "--seq_length", "32", "--micro_batch_size", "4", "--num_workers", "0",
                      "--warmup_steps", "1", "--max_steps", "6", "--log_freq", "10", "--eval_freq", "2",
                      "--eval_steps", "1", "--sample_tokens", "4", "--checkpoint_freq", "2",
                      "--use_tensorboard", "false", "--output_dir", str(out)])
    with pytest.raises(TrainingDiverged, match=r"^step 4: validation loss nan: the model has diverged; no sample"):
        train(cfg, callbacks=[_NaNAfterSave()])
    assert TrainingDiverged.exit_code == 3
    samples = (out / "samples.txt").read_text()
    assert samples.count("--- step ") == 1 and samples.startswith("--- step 2\n")
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "val_loss" in line]
    assert [e["step"] for e in evals] == [2] and math.isfinite(evals[0]["val_loss"])
    assert sorted(d.name for d in (out / "checkpoints").glob("step_*")) == ["step_2"]
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_2"
    weights = load_file(out / "checkpoints" / "step_2" / "model.safetensors")
    assert all(bool(t.isfinite().all()) for t in weights.values())


def test_cpu_yaml_is_two_torchrun_ranks_that_need_accelerate_use_cpu(monkeypatch):
    """accelerate_configs/cpu.yaml through accelerate 1.15's own launcher code: torchrun with 2 processes
    (MULTI_CPU would go to the one-process simple launcher); the env it gives the workers carries
    ACCELERATE_USE_CPU only from the caller (the YAML's use_cpu never reaches torchrun's workers), and a
    worker's backend is gloo/MULTI_CPU with it, "rank 0 of 1" without it (docs/distributed.md)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, parse_flag_from_env
    from accelerate.utils.launch import prepare_multi_gpu_env

    yaml_path = Path(__file__).resolve().parents[2] / "accelerate_configs" / "cpu.yaml"
    for caller_env, expected in ({}, DistributedType.NO), ({"ACCELERATE_USE_CPU": "1"}, DistributedType.MULTI_CPU):
        monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
        for k, v in caller_env.items():
            monkeypatch.setenv(k, v)
        args, _, _ = _validate_launch_command(launch_command_parser().parse_args(
            ["--config_file", str(yaml_path), "script.py"]))
        assert args.multi_gpu and not args.cpu and args.use_cpu  # -> multi_gpu_launcher (torchrun)
        env = prepare_multi_gpu_env(args)
        assert args.nproc_per_node == "2" and env.get("ACCELERATE_USE_CPU") == caller_env.get("ACCELERATE_USE_CPU")
        worker = {**env, "LOCAL_RANK": "1", "RANK": "1", "WORLD_SIZE": "2"}  # what torchrun adds per worker
        monkeypatch.setattr(os, "environ", worker)
        cpu = parse_flag_from_env("ACCELERATE_USE_CPU")  # what AcceleratorState() reads
        if not torch.cuda.is_available():
            assert PartialState._prepare_backend(object.__new__(PartialState), cpu)[1] == expected
        monkeypatch.undo()


def test_a_user_error_under_accelerate_launch_is_one_line_per_job(tmp_path):
    """2 CPU ranks through the real `accelerate launch` + torchrun: both ranks refuse the same flags, only
    rank 0 prints the line; rank 1 exits quietly with the same code."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    e = dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                        str(root / "accelerate_configs" / "cpu.yaml"), str(root / "train.py"), "--max_steps", "20",
                        "--warmup_steps", "30", "--output_dir", str(tmp_path / "r")],
                       capture_output=True, text=True, env=e, timeout=300, cwd=tmp_path)
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("error: ")]
    assert r.returncode != 0 and len(lines) == 1, r.stdout[-2000:] + r.stderr[-3000:]
    assert "config key 'warmup_steps': expected less than max_steps (20)" in lines[0]


def test_only_rank_0_prints_a_user_error_raised_before_the_process_group(monkeypatch, capsys):
    """What the launch test above shows end to end, without the race of torchrun killing rank 1 first."""
    from yxanul.cli import run
    from yxanul.config import parse_args

    for rank, printed in (("1", []), ("0", ["error: config key 'max_steps': expected an integer >= 1, got 0"])):
        monkeypatch.setenv("RANK", rank)
        assert run(parse_args, ["--max_steps", "0"]) == 2
        assert capsys.readouterr().err.splitlines() == printed


def test_what_accelerate_launch_exports_for_every_fp8_launch_is_no_warning():
    """accelerate's own launcher (its parser's defaults, its setup_fp8_env) exports ACCELERATE_FP8_INTERVAL=1
    for any FP8 launch: the start-up check said "remove it" to every FP8 run. A value the user chose is
    still one warning (Transformer Engine's recipe has no interval: accelerate drops it)."""
    from accelerate.commands.launch import launch_command_parser
    from accelerate.utils.launch import setup_fp8_env

    args = launch_command_parser().parse_args(["--mixed_precision", "fp8", "--fp8_backend", "te", "train.py"])
    env = setup_fp8_env(args, {})
    assert env["ACCELERATE_FP8_INTERVAL"] == "1" and env["ACCELERATE_FP8_BACKEND"] == "te"
    assert "ACCELERATE_FP8_INTERVAL" not in {p.key for p in check_launch_environment(env, use_fp8=True)}
    args = launch_command_parser().parse_args(["--mixed_precision", "fp8", "--fp8_interval", "4", "train.py"])
    assert "ACCELERATE_FP8_INTERVAL" in _keys(check_launch_environment(setup_fp8_env(args, {})), "warning")
