"""YxanulTrainer on CPU: the FP8 request falls back with one line, the precision report reaches output_dir
and the loggers, require_fp8 is a one-line error, and the loss curve is `yxanul train`'s."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback, TrainingArguments, set_seed

from yxanul.data.hf_dataset import ShardWindowDataset
from yxanul.errors import ConfigError, UserError
from yxanul.integrations import YxanulTrainer, precision_args_from_env
from yxanul.models import ModelArgs, build_model
from yxanul.precision import PrecisionArgs
from yxanul.precision.state import FILE
from yxanul.training.optim import OptimArgs, build_optimizer
from yxanul.training.schedule import lr_at

ROOT = Path(__file__).resolve().parents[2]
PRESET = "nano"  # the 5M CPU preset: the one place to change it
T, B, STEPS, SEED = 32, 4, 8, 0
OPT = OptimArgs(max_lr=2e-3, warmup_steps=3, lr_decay_steps=STEPS, min_lr_ratio=0.1, weight_decay=0.1,
                max_grad_norm=1.0)
# documented in docs/trainer.md ("Parity"): float32 on CPU, same kernels; what remains is summation order
PARITY_TOL = 1e-4


class Recorder(TrainerCallback):
    """Stands in for a report_to logger (W&B/TensorBoard): records every logs dict it would send."""

    def __init__(self):
        self.sent = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.sent.append(dict(logs))


def yxanul_train(data_dir, out):
    """`yxanul train` with the same model, data, seed and hyper-parameters; returns {step: loss}."""
    cmd = [sys.executable, "-m", "yxanul", "train", "--model", PRESET, "--backend", "torch", "--seq_length", str(T),
           "--micro_batch_size", str(B), "--max_steps", str(STEPS), "--seed", str(SEED), "--data_dir", str(data_dir),
           "--max_lr", str(OPT.max_lr), "--warmup_steps", str(OPT.warmup_steps), "--lr_decay_steps", str(STEPS),
           "--min_lr_ratio", str(OPT.min_lr_ratio), "--weight_decay", str(OPT.weight_decay), "--max_grad_norm", "1.0",
           "--log_freq", "1", "--eval_freq", "0", "--eval_steps", "1", "--sample_tokens", "0", "--num_workers", "0",
           "--use_tensorboard", "false", "--checkpoint_freq", "0", "--save_final", "false", "--use_fp8",
           "--output_dir", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "FP8 off: no CUDA device; training in FP32" in r.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def trainer_run(data_dir, vocab, out, precision):
    set_seed(SEED)  # as `yxanul train` does before building the model: the same initial weights
    model = build_model(ModelArgs(model=PRESET, seq_length=T, backend="torch"), vocab)
    opt = build_optimizer(model, OPT)  # yxanul's AdamW groups/betas and schedule (Trainer's defaults differ)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s, max_lr=OPT.max_lr, min_lr_ratio=OPT.min_lr_ratio,
                                                                  warmup_steps=OPT.warmup_steps,
                                                                  decay_steps=STEPS) / OPT.max_lr)
    args = TrainingArguments(output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=B, logging_steps=1,
                             max_grad_norm=1.0, seed=SEED, train_sampling_strategy="sequential", report_to=[],
                             use_cpu=True, disable_tqdm=True, save_strategy="no", dataloader_num_workers=0)
    rec = Recorder()
    trainer = YxanulTrainer(model=model, args=args, optimizers=(opt, sched), callbacks=[rec], precision=precision,
                            train_dataset=ShardWindowDataset(data_dir, T, seed=SEED))  # the loader's window order
    trainer.train()
    return trainer, rec


@pytest.mark.slow  # two 8-step runs, one through the CLI: 10-45 s here
def test_fp8_request_falls_back_with_one_line_report_and_parity_with_yxanul_train(small_data, tmp_path, capsys):
    data_dir, vocab = small_data
    trainer, rec = trainer_run(data_dir, vocab, tmp_path / "hf", PrecisionArgs(use_fp8=True))
    out = capsys.readouterr().out
    assert out.count("FP8 off: no CUDA device; training in FP32") == 1
    assert trainer.accelerator.mixed_precision == "no" and not trainer.plan.fp8_enabled
    rep = json.loads((tmp_path / "hf" / "precision_report.json").read_text())
    assert rep["fp8_requested"] and not rep["fp8"] and rep["fallback_reason"] == "no CUDA device"
    assert rep["precision"] == "FP32" and rep["layers"]["mlp"] == {"fp8": 0, "fp32": 4, "why": "no CUDA device"}
    first = rec.sent[0]  # what report_to loggers receive at the first logging step
    assert first["precision/fp8_requested"] == 1.0 and first["precision/fp8"] == 0.0
    assert first["precision/layers/qkv/fp8"] == 0.0 and "loss" in first
    assert not any(k.startswith("fp8/") for logs in rec.sent for k in logs)  # no FP8 statistics without FP8
    hf = {r["step"]: r["loss"] for r in trainer.state.log_history if "loss" in r}
    ours = yxanul_train(data_dir, tmp_path / "yx")
    assert sorted(hf) == sorted(ours) == list(range(1, STEPS + 1))
    diff = max(abs(hf[s] - ours[s]) for s in ours)
    with capsys.disabled():  # the number docs/trainer.md ("Parity") quotes: pytest -s ... -k parity
        print(f"\nparity: {STEPS} steps, max |Trainer loss - yxanul train loss| = {diff:.3g} (tolerance {PARITY_TOL})")
    assert diff < PARITY_TOL, (hf, ours)
    assert ours[STEPS] < ours[1] - 0.5  # and the shared curve is a learning one
    val = torch.utils.data.Subset(ShardWindowDataset(data_dir, T, split="val", seed=None), range(2 * B))
    assert trainer.label_names == ["shift_labels"]  # else Trainer's evaluation computes no loss
    assert 0 < trainer.evaluate(eval_dataset=val)["eval_loss"] < hf[1]


def test_require_fp8_is_one_line_and_no_fp8_is_plain_trainer(small_data, tmp_path, capsys):
    data_dir, vocab = small_data
    model = build_model(ModelArgs(model=PRESET, seq_length=T, backend="torch"), vocab)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], max_steps=1)
    with pytest.raises(UserError, match=r"^require_fp8: FP8 is impossible here: no CUDA device$"):
        YxanulTrainer(model=model, args=args, precision=PrecisionArgs(require_fp8=True))
    with pytest.raises(ConfigError, match="fp16"):
        YxanulTrainer(model=model, args=TrainingArguments(output_dir=str(tmp_path), fp16=True, use_cpu=True),
                      precision=PrecisionArgs(use_fp8=True))
    with pytest.MonkeyPatch.context() as mp:  # `yxanul train`'s launch rule (lint/fsdp.py), under accelerate's FSDP2
        mp.setenv("ACCELERATE_USE_FSDP", "true")
        model.config.fuse_qkv_rope = True
        with pytest.raises(ConfigError, match="^config key 'fuse_qkv_rope': expected false under FSDP2"):
            YxanulTrainer(model=model, args=args, precision=PrecisionArgs())
    plain = YxanulTrainer(model=model, args=args, precision=PrecisionArgs())  # one process, no engine: it may
    assert plain.accelerator.mixed_precision == "no" and not plain.plan.args.use_fp8
    model.config.fuse_qkv_rope = False
    assert plain.accelerator.te_recipe_handler is None
    bf16 = YxanulTrainer(model=model, args=TrainingArguments(output_dir=str(tmp_path), bf16=True, use_cpu=True,
                                                            report_to=[]), precision=PrecisionArgs(use_fp8=True))
    assert bf16.accelerator.mixed_precision == "bf16"  # the fallback keeps the user's bf16, and says so
    assert capsys.readouterr().out.count("FP8 off: no CUDA device; training in BF16") == 1


def test_precision_args_from_the_accelerate_launch_environment():
    env = {"ACCELERATE_MIXED_PRECISION": "fp8", "ACCELERATE_FP8_MARGIN": "1", "ACCELERATE_FP8_AMAX_HISTORY_LEN": "16",
           "ACCELERATE_FP8_FORMAT": "E4M3", "ACCELERATE_FP8_AMAX_COMPUTE_ALGO": "max"}
    p = precision_args_from_env(env, fp8_min_gemm_dim=0)
    assert (p.use_fp8, p.fp8_margin, p.fp8_amax_history_len, p.fp8_format, p.fp8_min_gemm_dim) \
        == (True, 1, 16, "e4m3", 0)
    assert not precision_args_from_env({"ACCELERATE_MIXED_PRECISION": "bf16"}).use_fp8
    with pytest.raises(ConfigError, match="ACCELERATE_FP8_MARGIN"):
        precision_args_from_env({"ACCELERATE_FP8_MARGIN": "one"})
    with pytest.raises(ConfigError, match="fp8_amax_compute_algo"):
        precision_args_from_env({"ACCELERATE_FP8_AMAX_COMPUTE_ALGO": "mean"})


def test_fp8_launch_config_without_fp8_hardware_trains_in_the_plans_precision(small_data, tmp_path, monkeypatch,
                                                                              capsys):
    """`accelerate launch --config_file accelerate_configs/single_gpu_fp8.yaml` exports
    ACCELERATE_MIXED_PRECISION=fp8; a plain Trainer hands that to Accelerator, which raises without TE.
    YxanulTrainer reads it as the FP8 request, decides, and builds the Accelerator with its fallback."""
    data_dir, vocab = small_data
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp8")
    monkeypatch.setenv("ACCELERATE_FP8_MARGIN", "1")
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], max_steps=1)
    assert args.mixed_precision == "fp8"  # what Trainer alone would pass to Accelerator
    trainer = YxanulTrainer(model=build_model(ModelArgs(model=PRESET, seq_length=T, backend="torch"), vocab), args=args)
    assert trainer.plan.args.use_fp8 and trainer.plan.args.fp8_margin == 1
    assert trainer.accelerator.mixed_precision == "no"
    assert capsys.readouterr().out.count("FP8 off: no CUDA device; training in FP32") == 1


class WandbStandIn(TrainerCallback):
    """Stands in for transformers' WandbCallback (``self._wandb`` = the wandb module with a live run):
    records what the real client would send as run config."""

    class _Config:
        def __init__(self):
            self.sent = []

        def update(self, d, allow_val_change=False):
            self.sent.append(d)

    def __init__(self):
        from types import SimpleNamespace

        self._wandb = SimpleNamespace(run=SimpleNamespace(config=self._Config()))


def test_whole_precision_report_reaches_tensorboard_and_wandb(small_data, tmp_path):
    """report_to=["tensorboard"] (a real, offline logger): the report's numbers as scalars and the whole
    report, strings included (the fallback reason), as text; the W&B run config gets it too."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data_dir, vocab = small_data
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=["tensorboard"], max_steps=1,
                             per_device_train_batch_size=2, logging_steps=1, save_strategy="no", disable_tqdm=True)
    wandb = WandbStandIn()
    trainer = YxanulTrainer(model=build_model(ModelArgs(model=PRESET, seq_length=T, backend="torch"), vocab),
                            args=args, train_dataset=ShardWindowDataset(data_dir, T),
                            precision=PrecisionArgs(use_fp8=True), callbacks=[wandb])
    trainer.train()
    [logged] = [r for r in trainer.state.log_history if "loss" in r]  # trainer_state.json's log history too
    assert logged["precision/fp8_requested"] == 1.0 and logged["precision/fp8"] == 0.0
    [sent] = wandb._wandb.run.config.sent
    assert sent["precision_report"]["fallback_reason"] == "no CUDA device"
    events = sorted({p.parent for p in tmp_path.rglob("events.out.tfevents.*")})
    acc = EventAccumulator(str(events[0]), size_guidance={"tensors": 0, "scalars": 0}).Reload()
    assert acc.Scalars("train/precision/fp8")[0].value == 0.0
    assert acc.Scalars("train/precision/fp8_requested")[0].value == 1.0
    text = acc.Tensors("precision_report/text_summary")[0].tensor_proto.string_val[0].decode()
    assert '"fallback_reason": "no CUDA device"' in text and '"precision": "FP32"' in text


def test_resume_hands_the_checkpoints_fp8_state_to_the_restore(small_data, tmp_path, capsys):
    """Without DeepSpeed too (Trainer loads the weights before `prepare` there): the checkpoint's FP8 state
    is looked up on resume, and a run without FP8 says it restored nothing and why."""
    from safetensors.torch import save_file

    data_dir, vocab = small_data

    def run(steps, resume=None):
        args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], max_steps=steps,
                                 per_device_train_batch_size=2, save_steps=2, disable_tqdm=True)
        YxanulTrainer(model=build_model(ModelArgs(model=PRESET, seq_length=T, backend="torch"), vocab), args=args,
                      train_dataset=ShardWindowDataset(data_dir, T), precision=PrecisionArgs(use_fp8=True)
                      ).train(resume_from_checkpoint=resume)

    run(2)
    state = tmp_path / "checkpoint-2" / FILE  # what a GPU run leaves there (a CPU run has no FP8 state)
    save_file({"model.layers.0.self_attention.layernorm_qkv.scaling_fwd.scale": torch.ones(3)}, str(state))
    capsys.readouterr()
    run(3, resume=str(tmp_path / "checkpoint-2"))
    assert capsys.readouterr().out.count(f"{state} not restored: FP8 is off in this run (no CUDA device)") == 1


@pytest.mark.slow  # one DeepSpeed process, two short trainings: 15-40 s here
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed")
def test_deepspeed_resume_hands_the_checkpoints_fp8_state_to_the_restore(small_data, tmp_path):
    """Under DeepSpeed Trainer loads checkpoints with DeepSpeed's own loader, never `_load_from_checkpoint`:
    YxanulTrainer must still find checkpoint-N/fp8_state.safetensors after the model is prepared. On CPU FP8
    is off, so the restore says it restored nothing and why (tests/integrations/ds_resume_driver.py; the
    GPU twin in test_trainer_gpu.py compares the restored TE scales with the saved ones)."""
    data_dir, _ = small_data
    cfg = str(ROOT / "ds_configs" / "zero1.json")
    r = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--use_deepspeed",
                        "--deepspeed_config_file", cfg, "--num_processes", "1", "--num_machines", "1",
                        "--main_process_port", "0",
                        str(ROOT / "tests" / "integrations" / "ds_resume_driver.py"), str(data_dir), str(tmp_path),
                        "--plant"], capture_output=True, text=True, cwd=ROOT, timeout=900, env=_ds_env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "resumed to step 3 under DeepSpeedEngine" in r.stdout
    state = tmp_path / "checkpoint-2" / FILE
    assert r.stdout.count(f"{state} not restored: FP8 is off in this run (no CUDA device)") == 1, r.stdout[-3000:]
    assert load_file(str(tmp_path / "restored_fp8_state.safetensors")) == {}  # no TE module: nothing to hold it


def _ds_env():
    cache = Path(os.environ.get("YXANUL_CACHE", Path.home() / ".cache" / "yxanul"))
    return dict(os.environ, HF_HUB_OFFLINE="1", TORCH_EXTENSIONS_DIR=str(cache / "torch_extensions"))


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed")
def test_building_the_trainer_prints_no_deepspeed_cpu_notice(tmp_path):
    """Trainer's accelerate imports DeepSpeed, whose import logs "Setting accelerator to CPU ..." on a CPU:
    YxanulTrainer imports it first with that one message dropped (as `yxanul train` does). Fresh process."""
    code = ("from transformers import TrainingArguments\nfrom yxanul.integrations import YxanulTrainer\n"
            "from yxanul.models import ModelArgs, build_model\nfrom yxanul.precision import PrecisionArgs\n"
            "m = build_model(ModelArgs(model='nano', seq_length=32, backend='torch'), 512)\n"
            f"a = TrainingArguments(output_dir={str(tmp_path)!r}, report_to=[], max_steps=1)\n"
            "t = YxanulTrainer(model=m, args=a, precision=PrecisionArgs())\nimport sys\n"
            "print('built', 'deepspeed' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1"))
    assert r.stdout.strip().endswith("built True"), r.stdout[-2000:] + r.stderr[-2000:]
    assert "Setting accelerator to CPU" not in r.stdout + r.stderr
