"""THE training step: precision context, ``is_first_microbatch``, gradient accumulation, clipping and
the optimizer step, in one function used by the trainer, the batch probe (`yxanul find-batch`),
`yxanul bench` and `yxanul verify`; `forward` (precision/forward.py) is its forward, also used for evaluation
and for the precision plan's FP8-metadata forward. What `yxanul bench` times is what training runs.

With an ``accelerator`` (the trainer): accelerate applies autocast (its prepared forward), scales the
loss by ``1 / gradient_accumulation_steps`` in ``accelerator.backward`` and clips with
``accelerator.clip_grad_norm_`` (DeepSpeed: the engine's norm). Accumulation does not use
``accelerator.accumulate``: that counts micro-steps in accelerate's own ``accelerator.step``, which
``load_state`` restores from the checkpoint and which drifts when accumulation changes (curriculum,
resume with another batch plan). Instead every micro-step sets ``accelerator.sync_gradients`` (the
public setter; DeepSpeed reads it as its accumulation boundary, the prepared optimizer steps only
when it is true) and the non-final ones run under ``accelerator.no_sync(model)`` (no DDP all-reduce).

Without an accelerator (probe, bench, verify): BF16 autocast when the plan's base precision is bf16
(what accelerate would apply), ``loss / accum`` backward, ``torch.nn.utils.clip_grad_norm_``.

Two precision flags, both no-ops by default: ``master_weights: fp32`` -- the clipped gradients are the fp32
masters' (`precision.master_weights.grad_params`), and with the fused (CUDA) AdamW the clip is applied inside its
step (`precision.master_weights.clip_in_step`; one process, so accelerate's clip would add nothing);
``cuda_graphs`` -- the TE blocks are captured before the first micro-batch of the first step, outside every
autocast context (`models.cuda_graphs.ensure_captured`), and any later step must have the same (B, T).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..data.loader import split_window
from ..models.cuda_graphs import ensure_captured
from ..precision.forward import forward
from ..precision.master_weights import clip_in_step, grad_params
from .direct import optimizer_step


@dataclass
class StepOutput:
    """One optimizer step. Sums over the micro-batches of THIS process (device tensors, detached; no
    host sync): divide by ``accum`` and reduce across processes to log. ``lm_loss``/``penalty`` are None
    when the model returns no separate LM loss (no penalty configured)."""

    loss: torch.Tensor                    # sum of the total loss over micro-batches, ()
    lm_loss: torch.Tensor | None          # sum of the LM (cross-entropy) loss, ()
    penalty: torch.Tensor | None          # sum of the penalty term, ()
    grad_norm: torch.Tensor | float | None  # before clipping; None without an optimizer step
    accum: int                            # micro-batches in this step


def _add(total, value):
    if value is None:
        return total
    value = value.detach().float() if value.dtype != torch.float32 else value.detach()
    return value.clone() if total is None else total + value


def to_device(batch, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A micro-batch on ``device`` as int64 (x, y), (B, T) each: the loader's packed (B, T + 1)
    shard-dtype tensor (one small copy, widened and sliced there) or an (x, y) pair."""
    if isinstance(batch, torch.Tensor):
        return split_window(batch, device)
    x, y = batch
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def _sync_context(accelerator, model, last: bool):
    if accelerator is None:
        return contextlib.nullcontext()
    accelerator.sync_gradients = last  # DeepSpeed's accumulation boundary; the optimizer steps only then
    return contextlib.nullcontext() if last else accelerator.no_sync(model)


def _clip(model, optimizer, accelerator, max_norm: float):
    """The gradient norm before the clip to ``max_norm``, and the clip: in the step of a fused master-weight AdamW
    (one process, where accelerate's clip adds nothing), else by accelerate or torch here."""
    norm = clip_in_step(optimizer, max_norm)
    if norm is not None:
        return norm
    params = grad_params(model, optimizer)  # the fp32 masters under master_weights: fp32
    if accelerator is None:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    norm = accelerator.clip_grad_norm_(params, max_norm)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: a replicated DTensor


def train_step(model, optimizer, batches: Sequence, *, plan=None, accelerator=None, max_grad_norm: float = 0.0,
               lr: float | None = None, device=None) -> StepOutput:
    """One optimizer step over ``batches`` (``accum`` micro-batches: (x, y) pairs of (B, T), or the loader's
    packed (B, T + 1) tensors): forward
    and backward per micro-batch (gradients summed, each loss scaled by 1/accum), then clip to
    ``max_grad_norm`` (0: no clipping, the norm is still measured), ``optimizer.step()`` and
    ``zero_grad``. ``optimizer=None``: forward/backward only (verify's read-back). ``lr``: set on every
    param group first. Every process must call it (collectives under DDP/DeepSpeed)."""
    accum = len(batches)
    if accelerator is not None and accelerator.gradient_accumulation_steps != accum:
        raise ValueError(f"train_step: {accum} micro-batches but the accelerator accumulates "
                         f"{accelerator.gradient_accumulation_steps}")
    if lr is not None and optimizer is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    device = device or (accelerator.device if accelerator is not None else next(model.parameters()).device)
    loss_sum = lm_sum = pen_sum = None
    for micro, batch in enumerate(batches):
        x, y = to_device(batch, device)  # (B, T) each
        if micro == 0:
            ensure_captured(model, x, plan)  # cuda_graphs: capture the TE blocks once, outside autocast
        with _sync_context(accelerator, model, last=micro == accum - 1):
            out = forward(model, x, y, plan=plan, micro=micro, accelerator=accelerator)
            if accelerator is not None:
                accelerator.backward(out.loss)  # scales by 1/gradient_accumulation_steps
            else:
                (out.loss / accum).backward()
        loss_sum = _add(loss_sum, out.loss)
        lm_sum = _add(lm_sum, getattr(out, "lm_loss", None))
        pen_sum = _add(pen_sum, getattr(out, "penalty", None))
    norm = None
    if optimizer is not None:
        norm = _clip(model, optimizer, accelerator, max_grad_norm or float("inf"))
        optimizer_step(optimizer, accelerator)  # past accelerate's wrapper where it adds nothing (training/direct.py)
    return StepOutput(loss_sum, lm_sum, pen_sum, norm, accum)
