"""The real probe: a few REAL training steps (forward, backward, optimizer.step, zero_grad) at a
micro-batch size, with random tokens, under the run's precision context, so activations, gradients
and the optimizer state all count."""

from __future__ import annotations

import contextlib
from typing import Callable


def _set_checkpointing(model, on: bool) -> None:
    if hasattr(model, "set_activation_checkpointing"):   # yxanul models: either transformers API
        model.set_activation_checkpointing(on)
    elif on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()


def _checkpointing_on(model) -> bool:
    if hasattr(model, "set_activation_checkpointing"):
        return model.activation_checkpointing
    return bool(getattr(model, "is_gradient_checkpointing", False))


class TrainingProbe:
    """``probe(b)``: ``steps`` real training steps at micro-batch ``b``; raises what the step raises
    (an out-of-memory error when ``b`` doesn't fit). ``peak_bytes[b]``: CUDA peak memory of the probe."""

    def __init__(self, model=None, *, model_factory: Callable[[], object] | None = None,
                 optimizer_factory: Callable[[object], object] | None = None, seq_length: int,
                 forward_context: Callable[[], contextlib.AbstractContextManager] | None = None,
                 vocab_size: int | None = None, device=None, gradient_checkpointing: bool | None = None,
                 steps: int = 2, forward_kwargs: dict | None = None):
        import torch

        if (model is None) == (model_factory is None):
            raise ValueError("make_training_probe: pass exactly one of model, model_factory")
        self.model, self.model_factory, self.optimizer_factory = model, model_factory, optimizer_factory
        self.seq_length, self.steps = seq_length, steps
        self.forward_context = forward_context or contextlib.nullcontext
        self.vocab_size = vocab_size
        self.device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        self.gradient_checkpointing = gradient_checkpointing
        self.forward_kwargs = dict(forward_kwargs or {})
        self.peak_bytes: dict[int, int] = {}
        self._saved = None  # the given model's state, restored after every probe

    def _optimizer(self, model):
        if self.optimizer_factory is not None:
            opt = self.optimizer_factory(model)
        else:
            from ..optim import OptimArgs, build_optimizer

            opt = build_optimizer(model, OptimArgs())
        for group in opt.param_groups:  # lr 0: AdamW leaves the weights bit-identical
            group["lr"] = 0.0
        return opt

    def __call__(self, b: int) -> None:
        import torch

        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        model = self.model
        if model is None:
            model = self.model_factory().to(self.device)
        else:
            if self._saved is None:
                self._saved = {k: (v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v)
                               for k, v in model.state_dict().items()}
            model.to(self.device)
        was_training, was_ckpt = model.training, _checkpointing_on(model)
        want_ckpt = was_ckpt if self.gradient_checkpointing is None else self.gradient_checkpointing
        if want_ckpt != was_ckpt:
            _set_checkpointing(model, want_ckpt)
        vocab = self.vocab_size or model.config.vocab_size
        opt = x = loss = None
        try:
            model.train()
            opt = self._optimizer(model)
            for _ in range(self.steps):
                x = torch.randint(0, vocab, (b, self.seq_length), device=self.device)
                with self.forward_context():
                    loss = model(x, shift_labels=x, return_logits=False, **self.forward_kwargs).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                loss = None
            if cuda:
                torch.cuda.synchronize(self.device)
        finally:
            if cuda:
                self.peak_bytes[b] = torch.cuda.max_memory_allocated(self.device)
            del opt, x, loss
            model.zero_grad(set_to_none=True)
            if self.model is not None:
                if want_ckpt != was_ckpt:
                    _set_checkpointing(model, was_ckpt)
                model.train(was_training)
                model.load_state_dict(self._saved)
            del model


def make_training_probe(model=None, *, model_factory=None, optimizer_factory=None, seq_length: int,
                        forward_context=None, vocab_size: int | None = None, device=None,
                        gradient_checkpointing: bool | None = None, steps: int = 2,
                        forward_kwargs: dict | None = None) -> TrainingProbe:
    """A probe for :func:`find_micro_batch` running ``steps`` REAL training steps at micro-batch ``b``.

    ``model``: the run's model (moved to ``device`` and left there; weights, buffers and FP8 state are
    restored after each probe) or ``model_factory()`` building a fresh one per probe. Optimizer:
    ``optimizer_factory(model)`` or yxanul's AdamW (lr forced to 0). ``forward_context()``: the run's
    precision context factory, e.g. ``lambda: plan.forward_context(training=True)`` (see
    :func:`probe_context`, which adds the BF16 autocast accelerate would apply).
    ``gradient_checkpointing``: None keeps the model's setting. ``vocab_size``: default the model's.
    """
    return TrainingProbe(model, model_factory=model_factory, optimizer_factory=optimizer_factory,
                         seq_length=seq_length, forward_context=forward_context, vocab_size=vocab_size,
                         device=device, gradient_checkpointing=gradient_checkpointing, steps=steps,
                         forward_kwargs=forward_kwargs)


def probe_context(plan, device) -> Callable[[], contextlib.AbstractContextManager]:
    """The run's forward context for a step outside the Accelerator: the BF16 autocast accelerate
    applies when the plan's base precision is bf16 (on CUDA or CPU), around
    ``plan.forward_context(training=True)``."""
    import torch

    device_type = torch.device(device).type

    def ctx():
        stack = contextlib.ExitStack()
        if plan is not None and getattr(plan, "base", None) == "bf16":
            stack.enter_context(torch.autocast(device_type, dtype=torch.bfloat16))
        if plan is not None:
            stack.enter_context(plan.forward_context(training=True))
        return stack

    return ctx
