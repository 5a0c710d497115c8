"""The per-step host work the trainer skips (accelerate's wrappers, lists rebuilt every step): each shortcut is
taken where it applies, and gives what the call it replaces gives."""

import pytest
from tiny_run import FAST


def _trainer(tmp_path, *extra):
    from yxanul.config import parse_args
    from yxanul.training import Trainer

    return Trainer(parse_args([*FAST, "--max_steps", "4", "--checkpoint_freq", "0", "--save_final", "false",
                               "--output_dir", str(tmp_path / "run"), *extra])).setup()


def test_the_unwrapped_model_is_unwrapped_once_per_model_object(tmp_path, monkeypatch):
    """`Trainer.unwrapped_model` is accelerate's ``unwrap_model`` of the model the trainer holds (compiled here),
    asked once: reading it again costs no ``unwrap_model`` call; another ``trainer.model`` is unwrapped anew."""
    t = _trainer(tmp_path, "--torch_compile")
    acc = t.accelerator
    assert t.model is not t.model._orig_mod  # compiled: unwrap_model keeps the compiled wrapper
    assert t.unwrapped_model is acc.unwrap_model(t.model)
    calls = []
    unwrap = acc.unwrap_model
    monkeypatch.setattr(acc, "unwrap_model", lambda m, *a, **k: calls.append(m) or unwrap(m, *a, **k))
    for _ in range(3):
        assert t.unwrapped_model is unwrap(t.model)
    assert calls == []  # cached
    t.model = t.model._orig_mod  # what a path that re-wraps the model does: another object
    assert t.unwrapped_model is unwrap(t.model) is t.model and len(calls) == 1
    assert t.unwrapped_model is t.model and len(calls) == 1
    t.finish()


def _steps(tmp_path, extra, n=3):
    """(losses, grad norms, final parameters) of ``n`` steps of a fresh tiny trainer."""
    import torch

    t = _trainer(tmp_path, *extra)
    outs = [t.advance(t.next_batches()) for _ in range(n)]
    params = [p.detach().clone() for p in t.unwrapped_model.parameters()]
    t.finish()
    return [o.loss for o in outs], [torch.as_tensor(o.grad_norm) for o in outs], params


CLIP = ("--max_grad_norm", "0.05")  # clipping on at every step of the tiny run


@pytest.mark.parametrize("extra", [("--gradient_accumulation_steps", "2", *CLIP),
                                   ("--mixed_precision", "bf16", "--master_weights", "fp32", *CLIP)],
                         ids=["accumulation+clip", "master_weights"])
def test_the_shortcuts_change_no_bit_of_training(tmp_path, monkeypatch, extra):
    """Three steps with every shortcut of the step taken, and the same three through accelerate's wrappers:
    bit-identical losses, gradient norms and weights (accumulation, clipping, fp32 master weights)."""
    import torch

    from yxanul.training import direct

    fast = _steps(tmp_path / "fast", extra)
    monkeypatch.setattr(direct, "plain", lambda accelerator: False)  # every wrapper kept
    slow = _steps(tmp_path / "slow", extra)
    for a, b in zip(fast, slow):
        assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_the_optimizer_steps_past_accelerates_wrapper_only_where_it_adds_nothing(tmp_path, monkeypatch):
    """One process without a grad scaler: `train_step` calls the AdamW inside accelerate's AcceleratedOptimizer
    (whose step/zero_grad would raise here), and like the wrapper neither steps nor zeroes while
    ``sync_gradients`` is false; FSDP, DeepSpeed, XLA, fp16's scaler or a parallelism config keep the wrapper."""
    import types

    import torch
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.utils import DeepSpeedOptimizerWrapper, DistributedType

    from yxanul.training.direct import direct_optimizer, optimizer_step, plain

    t = _trainer(tmp_path)
    opt, acc = t.optimizer, t.accelerator
    assert type(opt) is AcceleratedOptimizer and direct_optimizer(opt, acc) is opt.optimizer
    for name in ("step", "zero_grad"):
        monkeypatch.setattr(AcceleratedOptimizer, name, lambda *a, **k: pytest.fail("accelerate's wrapper ran"))
    before = [p.detach().clone() for p in t.model.parameters()]
    t.advance(t.next_batches())
    assert any(not torch.equal(a, b) for a, b in zip(before, t.model.parameters()))  # the step did step
    assert all(p.grad is None for p in t.model.parameters()) and opt.step_was_skipped is False
    for p in t.model.parameters():
        p.grad = torch.ones_like(p)
    before = [p.detach().clone() for p in t.model.parameters()]
    acc.sync_gradients = False  # a non-final micro-step: accelerate's wrapper does nothing
    optimizer_step(opt, acc)
    assert all(torch.equal(a, b) and b.grad is not None for a, b in zip(before, t.model.parameters()))
    acc.sync_gradients = True
    t.finish()

    def fake(**kw):
        base = dict(distributed_type=DistributedType.NO, scaler=None, native_amp=False, mixed_precision="bf16",
                    parallelism_config=None)
        return types.SimpleNamespace(**{**base, **kw})

    assert plain(fake()) and plain(fake(distributed_type=DistributedType.MULTI_GPU))
    for kw in (dict(distributed_type=DistributedType.FSDP), dict(distributed_type=DistributedType.DEEPSPEED),
               dict(distributed_type=DistributedType.XLA), dict(scaler=object()),
               dict(native_amp=True, mixed_precision="fp16"), dict(parallelism_config=object())):
        assert not plain(fake(**kw)), kw
    assert direct_optimizer(DeepSpeedOptimizerWrapper.__new__(DeepSpeedOptimizerWrapper), fake()) is None
    assert direct_optimizer(opt, None) is None  # no accelerator: the plain optimizer's own calls


def test_the_step_timer_leaves_out_what_it_is_told_to(monkeypatch):
    """Seconds per step between two logs: evaluation, saving and tracker start-up (`exclude`) are not steps, so
    tokens/s and MFU do not drop at every eval; a clock that did not move is 'not measured' (nan)."""
    import math

    from yxanul.training import runtime

    now = [100.0]
    monkeypatch.setattr(runtime.time, "perf_counter", lambda: now[0])
    timer = runtime.StepTimer()
    timer.steps, now[0] = 4, 112.0  # 4 steps in 12 s, 4 s of which an evaluation
    timer.exclude(4.0)
    assert timer.peek() == 2.0 and timer.lap() == 2.0 and timer.steps == 0
    timer.steps = 1
    assert math.isnan(timer.lap())  # no time has passed since the lap
