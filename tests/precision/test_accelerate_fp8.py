"""accelerate 1.15's FP8 machinery against yxanul's plan, on CPU.

`apply_fp8_autowrap` (accelerate/utils/transformer_engine.py) is the real function, fed a stand-in
`transformer_engine` package so it runs without a GPU; `unwrap_accelerate_fp8` must undo it on a
model and on a DDP-like wrapper. The BF16 path runs a real `Accelerator` on CPU.
"""

import contextlib
import sys
import types
from types import MethodType

import pytest
import torch

from yxanul.models import YxanulForCausalLM, config_from_preset
from yxanul.precision import CapabilityFacts, PrecisionArgs, resolve_precision, unwrap_accelerate_fp8

CPU = CapabilityFacts(te_available=False, te_import_error="x", cuda_available=False)


@pytest.fixture
def fake_te(monkeypatch):
    entered = []
    te = types.ModuleType("transformer_engine")
    pt = types.ModuleType("transformer_engine.pytorch")
    fp8 = types.ModuleType("transformer_engine.pytorch.fp8")
    common = types.ModuleType("transformer_engine.common")
    recipe = types.ModuleType("transformer_engine.common.recipe")

    @contextlib.contextmanager
    def fp8_autocast(enabled=True, fp8_recipe=None):
        entered.append((enabled, fp8_recipe))
        yield

    pt.fp8_autocast = fp8_autocast
    fp8.check_mxfp8_support = lambda: (False, "needs 10.0")
    recipe.Format = types.SimpleNamespace(HYBRID="HYBRID", E4M3="E4M3")
    recipe.DelayedScaling = lambda **kw: ("DelayedScaling", kw)
    recipe.MXFP8BlockScaling = lambda **kw: ("MXFP8BlockScaling", kw)
    te.pytorch, te.common, pt.fp8, common.recipe = pt, common, fp8, recipe
    for name, mod in [("transformer_engine", te), ("transformer_engine.pytorch", pt),
                      ("transformer_engine.pytorch.fp8", fp8), ("transformer_engine.common", common),
                      ("transformer_engine.common.recipe", recipe)]:
        monkeypatch.setitem(sys.modules, name, mod)
    import accelerate.utils.transformer_engine as ate

    monkeypatch.setattr(ate, "is_transformer_engine_available", lambda: True)
    monkeypatch.setattr(ate, "is_hpu_available", lambda: False)
    return ate, entered


def tiny():
    return YxanulForCausalLM(config_from_preset("nano", 1000, 32))


def test_unwrap_removes_accelerates_fp8_wrapper(fake_te):
    ate, entered = fake_te
    model = tiny().train()
    x = torch.randint(0, 1000, (1, 8))
    ate.apply_fp8_autowrap(model, None)  # what prepare() does for FP8BackendType.TE
    model(x)
    assert entered and entered[-1][1][0] == "DelayedScaling"  # accelerate's own recipe, not ours
    assert unwrap_accelerate_fp8(model) == 1 and "forward" not in model.__dict__
    n = len(entered)
    model(x)
    assert len(entered) == n  # no accelerate fp8_autocast any more


def test_unwrap_keeps_an_inner_wrapper_and_handles_ddp_like_outer(fake_te):
    ate, entered = fake_te
    model = tiny()
    calls = []
    orig = model.forward.__func__

    def amp_forward(self, *a, **k):  # stands for accelerate's native-amp autocast wrapper
        calls.append(1)
        return orig(self, *a, **k)

    model.forward = MethodType(amp_forward, model)
    ate.apply_fp8_autowrap(model, None)

    class Wrapper(torch.nn.Module):  # DDP: prepare() wraps the wrapper under MULTI_GPU
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, *a, **k):
            return self.module(*a, **k)

    outer = Wrapper(model)
    ate.apply_fp8_autowrap(outer, None)
    assert unwrap_accelerate_fp8(outer) == 2
    outer(torch.randint(0, 1000, (1, 8)))
    assert calls == [1] and model.forward.__func__ is amp_forward


def test_accelerate_ignores_te_recipe_knobs_we_need(fake_te, monkeypatch):
    """Why yxanul builds its own recipe: accelerate passes only non-default values and the default
    for amax_compute_algo is 'most_recent', so 'most_recent' can never reach TE; MXFP8 with
    amax_compute_algo raises."""
    from accelerate.utils import dataclasses as adc

    ate, entered = fake_te
    monkeypatch.setattr(adc, "is_transformer_engine_available", lambda: True)
    monkeypatch.setattr(sys.modules["transformer_engine.pytorch.fp8"], "check_mxfp8_support", lambda: (True, ""))
    kwargs = adc.TERecipeKwargs(amax_compute_algo="most_recent", interval=4).to_kwargs()
    assert "amax_compute_algo" not in kwargs and kwargs.get("interval") == 4  # interval: no TE field
    with pytest.raises(ValueError, match="amax_compute_algo"):
        ate.apply_fp8_autowrap(tiny(), adc.TERecipeKwargs(amax_compute_algo="max", use_mxfp8_block_scaling=True))


def test_bf16_plan_through_a_real_accelerator_keeps_the_tie():
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    model = tiny()
    plan = resolve_precision(PrecisionArgs(mixed_precision="bf16"), model.config, CPU)
    plan.prepare_model(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    try:
        acc = Accelerator(**plan.accelerator_kwargs(), cpu=True)
        pmodel, opt = acc.prepare(model, opt)
        plan.after_prepare(pmodel)
        inner = acc.unwrap_model(pmodel)
        assert inner.lm_head.weight is inner.model.embed_tokens.weight
        assert acc.mixed_precision == "bf16"
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()


def test_after_prepare_detects_converted_modules():
    model = tiny()
    plan = resolve_precision(PrecisionArgs(), model.config, CPU)
    plan.prepare_model(model)
    model.lm_head = torch.nn.Linear(256, 1000, bias=False)  # what convert_model would do to an nn.Linear head
    with pytest.raises(RuntimeError, match="replaced modules.*lm_head"):
        plan.after_prepare(model)


@pytest.mark.parametrize("recipe", ["delayed", "current", "block", "mxfp8"])
def test_fp8_accelerator_kwargs_are_accepted_by_accelerate_and_unwrapped(fake_te, monkeypatch, recipe):
    """An FP8 plan builds `Accelerator(mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs(...)])`:
    accelerate's real `apply_fp8_autowrap` must accept those kwargs for every recipe (for MXFP8 it
    raises on amax fields; TE has no `interval`), and `unwrap_accelerate_fp8` must remove its wrapper."""
    from accelerate.utils import dataclasses as adc

    from yxanul.precision import te_recipe_kwargs

    ate, entered = fake_te
    monkeypatch.setattr(adc, "is_transformer_engine_available", lambda: True)
    monkeypatch.setattr(sys.modules["transformer_engine.pytorch.fp8"], "check_mxfp8_support", lambda: (True, ""))
    args = PrecisionArgs(use_fp8=True, fp8_recipe=recipe, fp8_amax_history_len=16,
                         fp8_amax_compute_algo="max", fp8_interval=4)
    kwargs = te_recipe_kwargs(args)
    assert "interval" not in kwargs
    model = tiny().train()
    ate.apply_fp8_autowrap(model, adc.TERecipeKwargs(**kwargs))
    model(torch.randint(0, 1000, (1, 8)))
    assert entered[-1][1][0] == ("MXFP8BlockScaling" if recipe == "mxfp8" else "DelayedScaling")
    assert "interval" not in entered[-1][1][1]
    assert unwrap_accelerate_fp8(model) == 1 and "forward" not in model.__dict__
