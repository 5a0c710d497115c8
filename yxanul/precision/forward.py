"""The model's forward on one micro-batch under a precision plan: BF16 autocast as accelerate applies it
(outside an Accelerator), the plan's FP8 context and ``is_first_microbatch``. The training step
(training/step.py), evaluation and the plan's own FP8-metadata forward (``restore_fp8_state``) all use it."""

from __future__ import annotations

import contextlib

import torch


def autocast_context(plan, device, accelerator=None) -> contextlib.AbstractContextManager:
    """BF16 autocast as accelerate applies it, for a step outside the Accelerator (None inside it)."""
    if accelerator is None and plan is not None and getattr(plan, "base", None) == "bf16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def forward(model, x, y, *, plan=None, micro: int | None = 0, training: bool = True, accelerator=None):
    """The model's forward on one micro-batch (x, y: (B, T) token ids, y aligned targets) under the
    plan's precision context; returns the model output (``.loss``, maybe ``.lm_loss``/``.penalty``).
    ``micro``: index in the accumulation (TE's ``is_first_microbatch``; None: TE re-quantizes)."""
    device = x.device
    with autocast_context(plan, device, accelerator), \
            (plan.forward_context(training=training) if plan is not None else contextlib.nullcontext()):
        first = plan.is_first_microbatch(micro) if (plan is not None and training and micro is not None) else None
        return model(x, shift_labels=y, is_first_microbatch=first, return_logits=False)
