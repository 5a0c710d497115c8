"""Optimizer construction and the learning-rate schedule."""

import math

import torch

from yxanul.training.optim import OptimArgs, build_optimizer
from yxanul.training.schedule import lr_at


def test_lr_warmup_peak_and_floor():
    kw = dict(max_lr=6e-4, min_lr_ratio=0.1, warmup_steps=100, decay_steps=1000)
    assert lr_at(0, **kw) < lr_at(50, **kw) < lr_at(99, **kw) < 6e-4
    assert lr_at(100, **kw) == 6e-4                         # warmup end = peak
    assert math.isclose(lr_at(550, **kw), 6e-5 + 0.5 * (6e-4 - 6e-5))  # half-way down the cosine
    assert math.isclose(lr_at(1000, **kw), 6e-5)            # the end = min_lr_ratio * max_lr
    assert math.isclose(lr_at(5000, **kw), 6e-5)            # and stays there
    assert all(lr_at(s, **kw) >= lr_at(s + 1, **kw) for s in range(100, 1100))


def test_no_warmup():
    assert lr_at(0, max_lr=1.0, min_lr_ratio=0.0, warmup_steps=0, decay_steps=10) == 1.0


def test_optimizer_groups():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 4, bias=False))
    opt = build_optimizer(model, OptimArgs(weight_decay=0.1))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert {p.dim() for p in decay["params"]} == {2}
    assert {p.dim() for p in no_decay["params"]} == {1}


def test_decay_that_ends_before_warmup_is_a_config_error():
    import pytest

    from yxanul.errors import ConfigError

    assert OptimArgs(warmup_steps=100, lr_decay_steps=101).lr_decay_steps == 101
    for bad in (100, 50):
        with pytest.raises(ConfigError,
                           match=r"config key 'lr_decay_steps': expected an integer > warmup_steps \(100\)"):
            OptimArgs(warmup_steps=100, lr_decay_steps=bad)
