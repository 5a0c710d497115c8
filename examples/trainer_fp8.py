#!/usr/bin/env python
"""transformers.Trainer + a yxanul model + yxanul's prepared shards + FP8 (accelerate's "by feature" style).

    python examples/trainer_fp8.py                         # CPU: FP8 falls back to FP32 and says why
    accelerate launch --config_file accelerate_configs/single_gpu_fp8.yaml examples/trainer_fp8.py \
        --model medium --fp8_min_gemm_dim 0 --fp8_margin 1 --fp8_amax_history_len 16
    accelerate launch --use_deepspeed --deepspeed_config_file ds_configs/zero1.json --num_processes 1 \
        examples/trainer_fp8.py --deepspeed ds_configs/zero1.json --model medium --fp8_min_gemm_dim 0

Everything that is not marked "# New: ..." is a plain Trainer script. docs/trainer.md says when to
use this instead of `yxanul train` and what differs.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from transformers import TrainingArguments, set_seed

from yxanul.cli import run
from yxanul.data.args import DataArgs
from yxanul.data.hf_dataset import ShardWindowDataset
from yxanul.data.prepare import ensure_prepared
from yxanul.errors import UserError
from yxanul.flags import parse_command
from yxanul.models import ModelArgs, build_model
from yxanul.precision.args import DEFAULT_MIN_GEMM_DIM

CPU_PRESET = "nano"  # the 5M-parameter CPU preset


@dataclass
class ExampleCommand:
    """Trainer + yxanul model + prepared shards + FP8 (falls back with one line where FP8 is impossible)."""

    model: str = field(default=CPU_PRESET, metadata={"help": "yxanul preset (docs/models.md)."})
    seq_length: int = field(default=128, metadata={"help": "Tokens per training window."})
    max_steps: int = field(default=30, metadata={"help": "Optimizer steps."})
    micro_batch_size: int = field(default=8, metadata={"help": "Windows per device and micro-batch."})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "Micro-batches per optimizer step."})
    max_lr: float = field(default=2e-3, metadata={"help": "Peak learning rate (cosine schedule)."})
    data_dir: str | None = field(default=None, metadata={"help": "Prepared shards (default: the bundled corpus)."})
    output_dir: str = field(default="runs/trainer_fp8", metadata={"help": "Trainer output_dir."})
    deepspeed: str | None = field(default=None, metadata={"help": "DeepSpeed JSON, e.g. ds_configs/zero1.json."})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "Recompute activations in backward."})
    seed: int = field(default=0, metadata={"help": "Seed of the model init and of the window order."})
    fp8_recipe: Literal["delayed", "current", "block", "mxfp8"] = field(default="delayed",
                                                                        metadata={"help": "TE recipe."})
    fp8_margin: int | None = field(default=None, metadata={"help": "DelayedScaling/MXFP8 margin (default: the "
                                                                   "launch config's fp8_config, else 0)."})
    fp8_amax_history_len: int | None = field(default=None, metadata={"help": "DelayedScaling amax history length "
                                                                             "(default: launch config, else 1024)."})
    fp8_min_gemm_dim: int = field(default=DEFAULT_MIN_GEMM_DIM,
                                  metadata={"help": "Small-GEMM policy threshold (0: every layer)."})
    require_fp8: bool = field(default=False, metadata={"help": "Fail instead of falling back when FP8 is impossible."})


def main(argv: list[str] | None = None) -> int:
    a = parse_command(ExampleCommand, argv, prog="examples/trainer_fp8.py")
    if a.deepspeed is not None and not Path(a.deepspeed).is_file():  # TrainingArguments: a traceback, after the data
        raise UserError(f"deepspeed '{a.deepspeed}': no such file (a DeepSpeed JSON, e.g. ds_configs/zero1.json)")
    # New: yxanul's data: prepared once, then fixed-length windows in `yxanul train`'s order
    data_dir = ensure_prepared(DataArgs(data_dir=a.data_dir))
    vocab_size = json.loads((data_dir / "meta.json").read_text())["vocab_size"]
    # the run's batch: every epoch ends where `yxanul train`'s would (a whole number of optimizer steps)
    train_ds = ShardWindowDataset(data_dir, a.seq_length, seed=a.seed, epochs=100, micro_batch_size=a.micro_batch_size,
                                  world_size=int(os.environ.get("WORLD_SIZE", 1)),
                                  accumulation=a.gradient_accumulation_steps)
    eval_ds = ShardWindowDataset(data_dir, a.seq_length, split="val", seed=None)
    eval_ds = torch.utils.data.Subset(eval_ds, range(min(len(eval_ds), 4 * a.micro_batch_size)))

    set_seed(a.seed)
    model = build_model(ModelArgs(model=a.model, seq_length=a.seq_length), vocab_size)  # backend auto: TE on a GPU
    bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    args = TrainingArguments(
        output_dir=a.output_dir, max_steps=a.max_steps, per_device_train_batch_size=a.micro_batch_size,
        per_device_eval_batch_size=a.micro_batch_size, gradient_accumulation_steps=a.gradient_accumulation_steps,
        learning_rate=a.max_lr, lr_scheduler_type="cosine", warmup_steps=max(1, a.max_steps // 10),
        weight_decay=0.1, adam_beta2=0.95, max_grad_norm=1.0, bf16=bf16, seed=a.seed,
        deepspeed=a.deepspeed, **({"gradient_checkpointing": True} if a.gradient_checkpointing else {}),
        train_sampling_strategy="sequential",  # the dataset is already shuffled, deterministically
        label_names=["shift_labels"],  # its targets (Trainer's default also wants `labels` before it evaluates)
        logging_steps=5, eval_strategy="steps", eval_steps=max(1, a.max_steps // 2), save_steps=a.max_steps,
        report_to=["tensorboard"], dataloader_num_workers=0, disable_tqdm=True,
        dataloader_pin_memory=torch.cuda.is_available())  # pinned memory serves a copy to a GPU; warns without one

    # New: FP8 through yxanul's precision plan (Trainer alone drops the TE recipe: docs/trainer.md)
    from yxanul.integrations import YxanulTrainer, precision_args_from_env

    given = {k: v for k, v in (("fp8_margin", a.fp8_margin), ("fp8_amax_history_len", a.fp8_amax_history_len))
             if v is not None}  # else what `accelerate launch`'s fp8_config exported
    precision = precision_args_from_env(use_fp8=True, require_fp8=a.require_fp8, fp8_recipe=a.fp8_recipe,
                                        fp8_min_gemm_dim=a.fp8_min_gemm_dim, **given)
    trainer = YxanulTrainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                            precision=precision)

    result = trainer.train()
    metrics = trainer.evaluate()
    trainer.save_model()  # from_pretrained(output_dir) loads it, on either backend
    if trainer.is_world_process_zero():
        print(f"done: {trainer.state.global_step} steps in {trainer.plan.label}; "
              f"train_loss {result.training_loss:.4f}, "
              f"eval_loss {metrics['eval_loss']:.4f}; report in {a.output_dir}/precision_report.json")
    return 0


if __name__ == "__main__":
    sys.exit(run(main, sys.argv[1:], process_exit=True))
