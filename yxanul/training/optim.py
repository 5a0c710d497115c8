"""`OptimArgs` (optimizer and LR-schedule settings) and AdamW with decay/no-decay groups. The schedule
itself (`lr_at`, a pure function of the step) lives with the curriculum in
:mod:`yxanul.training.schedule`."""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:  # torch is imported where an optimizer is built, so the CLI parses flags without it
    import torch


@dataclass
class OptimArgs:
    """Optimizer and learning-rate schedule."""

    max_lr: float = field(default=6e-4, metadata={"help": "Peak learning rate, reached at the end of warmup."})
    min_lr_ratio: float = field(default=0.1,
                                metadata={"help": "Final learning rate as a fraction of max_lr (cosine floor)."})
    warmup_steps: int = field(default=100, metadata={"help": "Optimizer steps of linear warmup from 0 to max_lr."})
    warmup_tokens: int | None = field(default=None, metadata={
        "help": "The warmup in tokens instead of warmup_steps (set one of them): converted once to optimizer steps, "
                "rounded up, from the tokens per optimizer step: target_tokens_per_step, else "
                "target_effective_batch_size x seq_length, else micro_batch_size x gradient_accumulation_steps x "
                "world size x seq_length (needs a target with auto_batch_size); seq_length is the model's (the longest "
                "curriculum stage): every stage keeps those tokens per step, so the conversion is exact for the whole "
                "run."})
    lr_decay_steps: int | None = field(
        default=None,
        metadata={"help": "Optimizer step at which the cosine reaches its floor (default: max_steps). "
                          "Keep it fixed when a run is trained in several pieces."},
    )
    weight_decay: float = field(default=0.1,
                                metadata={"help": "AdamW weight decay for >=2-D weights (matrices, embeddings); "
                                                  "1-D params (norm weights) never decay."})
    beta1: float = field(default=0.9, metadata={"help": "AdamW beta1."})
    beta2: float = field(default=0.95, metadata={"help": "AdamW beta2."})
    adam_eps: float = field(default=1e-8, metadata={"help": "AdamW epsilon."})
    max_grad_norm: float = field(default=1.0,
                                 metadata={"help": "Clip the global gradient norm to this value "
                                                   "(0 disables clipping)."})

    def __post_init__(self):
        if not 0 < self.max_lr < math.inf:  # also rejects nan
            raise ConfigError("max_lr", "a positive finite float", self.max_lr)
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError("min_lr_ratio", "a float in [0, 1]", self.min_lr_ratio)
        if self.warmup_steps < 0:
            raise ConfigError("warmup_steps", "an integer >= 0", self.warmup_steps)
        w = self.warmup_tokens
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 0):
            raise ConfigError("warmup_tokens", "an integer >= 0 or null", w)
        if self.lr_decay_steps is not None and self.lr_decay_steps <= 0:
            raise ConfigError("lr_decay_steps", "a positive integer or null", self.lr_decay_steps)
        if self.lr_decay_steps is not None and self.lr_decay_steps <= self.warmup_steps:
            raise ConfigError("lr_decay_steps", f"an integer > warmup_steps ({self.warmup_steps}): the cosine "
                              "decays from the end of warmup to lr_decay_steps", self.lr_decay_steps)
        if not 0 <= self.weight_decay < math.inf:
            raise ConfigError("weight_decay", "a float >= 0", self.weight_decay)
        if not 0 <= self.max_grad_norm < math.inf:
            raise ConfigError("max_grad_norm", "a finite float >= 0", self.max_grad_norm)
        for key in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(key, "a float in [0, 1)", getattr(self, key))
        if not 0 < self.adam_eps < math.inf:
            raise ConfigError("adam_eps", "a positive finite float", self.adam_eps)


def build_optimizer(model: torch.nn.Module, args: OptimArgs, fp8_weights: bool = False) -> torch.optim.Optimizer:
    """AdamW with two groups: >=2-D weights decay, 1-D params (norm weights) don't.

    Uses the fused CUDA kernel when every parameter is on a CUDA device. ``fp8_weights`` (the model's TE
    weights are FP8, ``fp8_weight_all_gather``): TE's FusedAdam with fp32 masters, the same groups.
    """
    import torch

    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": args.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    kwargs = {}
    if "fused" in inspect.signature(torch.optim.AdamW).parameters:
        kwargs["fused"] = all(p.is_cuda for p in decay + no_decay) and len(decay + no_decay) > 0
    from ..precision.master_weights import build as master_weight_adamw  # torch: config reads OptimArgs here

    masters = master_weight_adamw(model, groups, fp8_weights, lr=args.max_lr, betas=(args.beta1, args.beta2),
                                  eps=args.adam_eps, **kwargs)
    return masters if masters is not None else torch.optim.AdamW(
        groups, lr=args.max_lr, betas=(args.beta1, args.beta2), eps=args.adam_eps, **kwargs
    )
