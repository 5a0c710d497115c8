"""The real probe: a few REAL training steps at a micro-batch size, with random tokens: the trainer's
own :func:`yxanul.training.step.train_step` (precision context, BF16 autocast as accelerate applies
it, ``is_first_microbatch``, backward, clipping, ``optimizer.step``), so activations, gradients and
the optimizer state all count."""

from __future__ import annotations

from ..optim import OptimArgs, build_optimizer


def _set_checkpointing(model, on: bool) -> None:
    if hasattr(model, "set_activation_checkpointing"):   # yxanul models: either transformers API
        model.set_activation_checkpointing(on)
    elif on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()


def checkpointing_on(model) -> bool:
    if hasattr(model, "set_activation_checkpointing"):
        return model.activation_checkpointing
    return bool(getattr(model, "is_gradient_checkpointing", False))


class TrainingProbe:
    """``probe(b)``: ``steps`` real training steps of ``model`` at micro-batch ``b`` under ``plan`` (None:
    FP32); raises what the step raises (an out-of-memory error when ``b`` doesn't fit). The model is
    moved to ``device`` and left there; its weights, buffers and FP8 state are restored after each
    probe (yxanul's AdamW runs with lr 0 besides). ``peak_bytes[b]``: CUDA peak memory of the probe.
    ``gradient_checkpointing``: None keeps the model's setting; ``vocab_size``: default the model's."""

    def __init__(self, model, *, seq_length: int, plan=None, device=None, vocab_size: int | None = None,
                 gradient_checkpointing: bool | None = None, steps: int = 2, max_grad_norm: float = 1.0):
        import torch

        self.model, self.plan, self.seq_length, self.steps = model, plan, seq_length, steps
        self.vocab_size, self.max_grad_norm = vocab_size, max_grad_norm
        self.device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        self.gradient_checkpointing = gradient_checkpointing
        self.peak_bytes: dict[int, int] = {}
        self._saved = None  # the model's state, restored after every probe

    def _optimizer(self):
        # the run's kind: FP8 weights (fp8_weight_all_gather) are stepped by FusedAdam with fp32 masters
        opt = build_optimizer(self.model, OptimArgs(), fp8_weights=getattr(self.plan, "fp8_weights", False))
        for group in opt.param_groups:  # lr 0: AdamW leaves the weights bit-identical
            group["lr"] = 0.0
        return opt

    def __call__(self, b: int) -> None:
        import torch

        from ..step import train_step  # torch: find-batch's --help imports this module

        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        model = self.model
        if self._saved is None:
            self._saved = {k: (v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v)
                           for k, v in model.state_dict().items()}
        model.to(self.device)
        was_training, was_ckpt = model.training, checkpointing_on(model)
        want_ckpt = was_ckpt if self.gradient_checkpointing is None else self.gradient_checkpointing
        if want_ckpt != was_ckpt:
            _set_checkpointing(model, want_ckpt)
        vocab = self.vocab_size or model.config.vocab_size
        opt = x = None
        try:
            model.train()
            opt = self._optimizer()
            for _ in range(self.steps):
                x = torch.randint(0, vocab, (b, self.seq_length), device=self.device)  # (B, T)
                train_step(model, opt, [(x, x)], plan=self.plan, max_grad_norm=self.max_grad_norm)
            if cuda:
                torch.cuda.synchronize(self.device)
        finally:
            if cuda:
                self.peak_bytes[b] = torch.cuda.max_memory_allocated(self.device)
            del opt, x
            model.zero_grad(set_to_none=True)
            if want_ckpt != was_ckpt:
                _set_checkpointing(model, was_ckpt)
            model.train(was_training)
            model.load_state_dict(self._saved)
