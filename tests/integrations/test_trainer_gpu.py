"""GPU + TE: under transformers.Trainer (YxanulTrainer), TE itself reports FP8 with the configured recipe
(delayed, margin 1, amax_history_len 16), alone and under DeepSpeed ZeRO-1; FP8 statistics reach the
loggers; the delayed-scaling state travels with Trainer checkpoints and comes back on resume (alone and
under ZeRO-1: the restored scales and amax histories are the saved ones).

DeepSpeed runs go through `accelerate launch` in a subprocess (it sets RANK/WORLD_SIZE/MASTER_ADDR/...
for its one process; in-process DeepSpeed would also leave torch.distributed initialised for later tests).
Subprocess timeouts stay under gpu_checks.sh's 570 s per pytest run, so a hang fails one test only."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback, TrainingArguments, set_seed

pytestmark = [pytest.mark.gpu, pytest.mark.te]

ROOT = Path(__file__).resolve().parents[2]
GPU_PRESET, T = "medium", 256  # 1024 wide: FP8 only with fp8_min_gemm_dim=0 (the policy keeps it BF16 otherwise)
RECIPE = dict(use_fp8=True, require_fp8=True, fp8_recipe="delayed", fp8_margin=1, fp8_amax_history_len=16,
              fp8_min_gemm_dim=0)


class Recorder(TrainerCallback):
    """Stands in for a report_to logger: records every logs dict it would send."""

    def __init__(self):
        self.sent = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.sent.append(dict(logs))


class ScalesAtStart(TrainerCallback):
    """TE's delayed-scaling state when training starts: after any resume, before the first step."""

    def __init__(self):
        self.state = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        from yxanul.precision.state import fp8_state_dict

        self.state = fp8_state_dict(model)


def assert_same_state(saved: dict, restored: dict) -> None:
    """Every saved scale/amax history is back, value for value, and is not TE's initial state."""
    assert saved and sorted(saved) == sorted(restored), (len(saved), len(restored))
    hist = [v for k, v in saved.items() if k.endswith(".amax_history")]
    assert hist and all(h.shape[0] == RECIPE["fp8_amax_history_len"] for h in hist)  # the configured length
    assert any(bool((h != 0).any()) for h in hist)  # real amaxes, not the zeros of a fresh module
    for k, v in saved.items():
        assert torch.equal(v, restored[k]), k


def launch(script: Path, *args: str, timeout: int = 400) -> subprocess.CompletedProcess:
    """`accelerate launch` with DeepSpeed ZeRO-1, one process."""
    cfg = str(ROOT / "ds_configs" / "zero1.json")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--use_deepspeed", "--deepspeed_config_file", cfg,
           "--num_processes", "1", "--num_machines", "1", "--main_process_port", "0", str(script), *args]
    # own process group: on a timeout the launcher's worker (a grandchild) goes too, not left on the GPU
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         env=dict(os.environ, HF_HUB_OFFLINE="1"), start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"accelerate launch timed out after {timeout} s\n" + out[-3000:] + err[-3000:])
    r = subprocess.CompletedProcess(cmd, p.returncode, out, err)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def check_readback(rep: dict) -> None:
    rb = rep["te_readback"]
    assert rep["fp8"] and rep["precision"] == "FP8" and rb["fp8_confirmed"], rep
    assert rb["recipe"] == "DelayedScaling" and rb["module_recipes"] == ["DelayedScaling"]
    assert "margin=1" in rb["recipe_repr"] and "amax_history_len=16" in rb["recipe_repr"], rb["recipe_repr"]
    assert rb["fp8_modules"] == rb["fp8_modules_planned"] > 0


def test_trainer_runs_the_configured_fp8_recipe_and_resumes_its_scales(small_data, tmp_path):
    from yxanul import _te
    from yxanul.data.hf_dataset import ShardWindowDataset
    from yxanul.integrations import YxanulTrainer
    from yxanul.models import ModelArgs, build_model
    from yxanul.precision import PrecisionArgs
    from yxanul.precision.state import FILE

    data_dir, vocab = small_data
    ds = ShardWindowDataset(data_dir, T, seed=0)

    def run(resume=None):
        _te.reset_fp8_state()  # as a new process would start: no amax buffers of an earlier model
        set_seed(0)
        model = build_model(ModelArgs(model=GPU_PRESET, seq_length=T, backend="te"), vocab)
        args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4,
                                 gradient_accumulation_steps=2, bf16=True, logging_steps=1, save_steps=2,
                                 report_to=[], disable_tqdm=True, train_sampling_strategy="sequential")
        rec, start = Recorder(), ScalesAtStart()
        trainer = YxanulTrainer(model=model, args=args, train_dataset=ds, callbacks=[rec, start],
                                precision=PrecisionArgs(**RECIPE))
        trainer.train(resume_from_checkpoint=resume)
        return trainer, rec, start

    trainer, rec, _ = run()
    assert trainer.accelerator.mixed_precision == "fp8"
    check_readback(json.loads((tmp_path / "precision_report.json").read_text()))
    train_logs = [logs for logs in rec.sent if "loss" in logs]
    assert train_logs[0]["precision/te_readback/fp8_confirmed"] == 1.0
    assert all(logs["fp8/tensors"] > 0 and logs["fp8/nonfinite"] == 0 for logs in train_logs)
    assert (tmp_path / "checkpoint-2" / FILE).is_file()
    saved = load_file(str(tmp_path / "checkpoint-2" / FILE))
    resumed, _, start = run(resume=str(tmp_path / "checkpoint-2"))
    assert_same_state(saved, start.state)  # restored before the first resumed step
    check_readback(json.loads((tmp_path / "precision_report.json").read_text()))
    assert resumed.state.global_step == 4


@pytest.mark.slow
def test_trainer_fp8_recipe_under_deepspeed_zero1(small_data, tmp_path):
    """accelerate ignores TERecipeKwargs under DeepSpeed; TE must still run the configured recipe."""
    pytest.importorskip("deepspeed", reason="needs deepspeed")
    out = tmp_path / "ds"
    r = launch(ROOT / "examples" / "trainer_fp8.py", "--deepspeed", str(ROOT / "ds_configs" / "zero1.json"),
               "--data_dir", str(small_data[0]),
               "--model", GPU_PRESET, "--seq_length", str(T), "--max_steps", "4", "--micro_batch_size", "4",
               "--fp8_min_gemm_dim", "0", "--fp8_margin", "1", "--fp8_amax_history_len", "16", "--require_fp8",
               "--output_dir", str(out))
    check_readback(json.loads((out / "precision_report.json").read_text()))
    assert "in FP8;" in r.stdout


@pytest.mark.slow
def test_deepspeed_zero1_resume_restores_the_saved_fp8_scales(small_data, tmp_path):
    """Under DeepSpeed, Trainer resumes through DeepSpeed's own loader: the FP8 state must come back anyway
    (tests/integrations/ds_resume_driver.py: 2 steps, checkpoint-2, a fresh model resumed from it; the
    state is dumped at the resumed run's on_train_begin)."""
    pytest.importorskip("deepspeed", reason="needs deepspeed")
    from yxanul.precision.state import FILE

    data_dir, _ = small_data
    r = launch(ROOT / "tests" / "integrations" / "ds_resume_driver.py", str(data_dir), str(tmp_path), "--gpu")
    assert "resumed to step 3 under DeepSpeedEngine" in r.stdout
    saved = load_file(str(tmp_path / "checkpoint-2" / FILE))
    assert_same_state(saved, load_file(str(tmp_path / "restored_fp8_state.safetensors")))
    assert f"restored {len(saved)} FP8 scaling tensors from {tmp_path / 'checkpoint-2' / FILE}" in r.stdout
    check_readback(json.loads((tmp_path / "precision_report.json").read_text()))
