"""Other trainers' names for yxanul's config keys (transformers' TrainingArguments, Lightning, nanoGPT, Megatron,
the scripts yxanul replaces). A flag or YAML key that is one of them is still refused -- one spelling per key --
but its one-line error names yxanul's key and what it means, instead of the nearest spelling ("did you mean
'checkpoint_freq'?" for --checkpoint_dir). Keys are compared with dashes as underscores, in lower case."""

from __future__ import annotations

_RUN_DIR = ("output_dir", "the run directory: checkpoints, metrics, TensorBoard events and samples live under it")
_STEPS = ("max_steps", "optimizer steps (tokens = max_steps x target_tokens_per_step)")
_CKPT_FREQ = ("checkpoint_freq", "optimizer steps between checkpoints")
_RESUME = ("resume", "'latest', 'auto' or a checkpoint folder")
_SEQ = ("seq_length", "tokens per sequence")
_CLIP = ("max_grad_norm", "the gradient-norm clip")
_ACCUM = ("gradient_accumulation_steps", "micro-batches per optimizer step")
_LOG = ("log_freq", "optimizer steps between log lines")
_WARMUP = ("warmup_steps", "optimizer steps of linear warm-up (or warmup_tokens)")
_PRECISION = ("mixed_precision", "auto, fp32 or bf16 (BF16 needs no loss scaling: no fp16); use_fp8 for FP8")
_EPOCHS = ("max_steps", "optimizer steps, not epochs: tokens = max_steps x target_tokens_per_step, and the loader "
                        "starts a new shuffled epoch when the data runs out")
_PRESET = ("model", "a preset: the shapes come from it (docs/models.md)")
_PROCESSES = ("processes and nodes are the launcher's: accelerate launch --num_processes N [--num_machines M] "
              "train.py ... (or yxanul launch; docs/distributed.md)")

FOREIGN_KEYS: dict[str, tuple[str | None, str]] = {
    "learning_rate": ("max_lr", "the peak learning rate"), "lr": ("max_lr", "the peak learning rate"),
    "min_lr": ("min_lr_ratio", "the final learning rate as a fraction of max_lr"),
    "checkpoint_dir": _RUN_DIR, "save_dir": _RUN_DIR, "logdir": _RUN_DIR, "log_dir": _RUN_DIR,
    "logging_dir": _RUN_DIR, "out_dir": _RUN_DIR,
    "save_steps": _CKPT_FREQ, "save_every_n_steps": _CKPT_FREQ, "save_interval": _CKPT_FREQ,
    "checkpoint_interval": _CKPT_FREQ,
    "eval_interval": ("eval_freq", "optimizer steps between evaluations"),
    "logging_steps": _LOG, "log_interval": _LOG,
    "resume_from": _RESUME, "resume_from_checkpoint": _RESUME, "checkpoint": _RESUME,
    "total_tokens": _STEPS, "max_iters": _STEPS, "total_steps": _STEPS, "num_train_steps": _STEPS,
    "train_steps": _STEPS,
    "warmup": _WARMUP, "warmup_iters": _WARMUP,
    "global_batch_size": ("target_tokens_per_step", "tokens per optimizer step (or target_effective_batch_size "
                                                    "in sequences)"),
    "batch_size": ("micro_batch_size", "sequences per process and forward (target_effective_batch_size: all)"),
    "per_device_train_batch_size": ("micro_batch_size", "sequences per process and forward"),
    "grad_accum": _ACCUM, "gradient_accumulation": _ACCUM, "accumulate_grad_batches": _ACCUM,
    "grad_clip": _CLIP, "clip_grad": _CLIP, "gradient_clip_val": _CLIP, "gradient_clipping": _CLIP,
    "block_size": _SEQ, "seq_len": _SEQ, "max_seq_length": _SEQ, "context_length": _SEQ,
    "wandb": ("use_wandb", "true or false"), "no_wandb": ("use_wandb", "false to turn W&B off"),
    "tensorboard": ("use_tensorboard", "true or false"),
    "compile": ("torch_compile", "true or false"),
    "fp8": ("use_fp8", "true or false (fp8_recipe picks the TE recipe)"),
    "precision": _PRECISION, "bf16": _PRECISION, "fp16": _PRECISION,
    "max_batch_size": ("max_micro_batch_size", "the upper bound of the micro-batch search (auto_batch_size)"),
    "warmup_ratio": ("warmup_steps", "optimizer steps of linear warm-up (warmup_ratio x max_steps; or "
                                     "warmup_tokens)"),
    "deepspeed": (None, "DeepSpeed comes from the launcher: accelerate launch --config_file "
                        "accelerate_configs/deepspeed_zero1_fp8.yaml train.py ... (ds_configs/*.json are its "
                        "DeepSpeed files; docs/distributed.md)"),
    "adam_beta1": ("beta1", "AdamW's beta1"), "adam_beta2": ("beta2", "AdamW's beta2"),
    "adam_epsilon": ("adam_eps", "AdamW's epsilon"),
    "dataloader_num_workers": ("num_workers", "DataLoader worker processes"),
    "n_layer": _PRESET, "n_embd": _PRESET, "n_head": _PRESET,
    "use_transformer_engine": ("backend", "te (Transformer Engine layers), torch (the plain twin) or auto"),
    "compile_mode": ("torch_compile", "true or false"),
    # no training key: the launcher's (`yxanul plan` has --gpus and --nodes for the same), or nothing to set
    "devices": ("gpus", _PROCESSES), "gpus": (None, _PROCESSES), "nproc_per_node": ("gpus", _PROCESSES),
    "num_gpus": ("gpus", _PROCESSES), "nodes": (None, _PROCESSES), "num_nodes": ("nodes", _PROCESSES),
    "num_machines": ("nodes", _PROCESSES),
    "strategy": (None, "the accelerate profile picks DDP, DeepSpeed ZeRO or FSDP2: accelerate launch --config_file "
                       "accelerate_configs/<profile>.yaml train.py ... (docs/distributed.md)"),
    "use_flash_attention": (None, "nothing to set: attention runs fused flash kernels by itself (SDPA, TE)"),
    "num_epochs": _EPOCHS, "num_train_epochs": _EPOCHS, "epochs": _EPOCHS, "max_epochs": _EPOCHS,
    "prefetch_factor": ("num_workers", "DataLoader worker processes; each prefetches 2 batches, DataLoader's "
                                       "default"),
}

# Other trainers' VALUES for one of yxanul's keys: (key, value) -> what to set instead.
FOREIGN_VALUES: dict[tuple[str, str], str] = {
    ("mixed_precision", "fp8"): "FP8 is its own key, use_fp8 true; the layers it does not cover keep mixed_precision",
    ("mixed_precision", "fp16"): "no fp16: bf16 has fp32's range and needs no loss scaling",
}


def yxanul_key_for(key: str, known, advice: bool = True) -> str | None:
    """"yxanul's key is 'max_lr': the peak learning rate" for another trainer's name of a key in ``known``; with
    ``advice`` (the training config's keys), for a setting that is no key (processes, nodes), where it is set."""
    ours, what = FOREIGN_KEYS.get(key.replace("-", "_").lower(), (None, None))
    if ours is not None and ours in known:
        return f"yxanul's key is '{ours}'" + ("" if what == _PROCESSES else f": {what}")
    no_key_here = ours is None or what == _PROCESSES  # a setting this command has no key for: where it is set
    return what if (advice and no_key_here) else None
