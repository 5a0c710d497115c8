"""The FP8 plan against the REAL Transformer Engine and accelerate, with or without a GPU (marker `te`).

Runs wherever `transformer_engine.pytorch` imports (the device machine; a CPU machine with the TE
wheels: `bash scripts/device/cpu_te_env.sh`). Hardware facts are injected where a CPU lacks them
(`CapabilityFacts`, `torch.cuda.is_available` for building TE modules on the meta device, and
TE's `check_mxfp8_support`, which needs a Blackwell GPU); everything else is TE's and accelerate's
own code: recipe classes, `TERecipeKwargs`, `apply_fp8_autowrap`, TE module trees.
"""

import inspect

import pytest
import torch

from yxanul import _te
from yxanul.models import YxanulForCausalLM, config_from_preset
from yxanul.precision import (
    CapabilityFacts,
    PrecisionArgs,
    build_recipe,
    format_report,
    precision_report,
    resolve_precision,
    te_recipe_kwargs,
    unwrap_accelerate_fp8,
)

pytestmark = pytest.mark.te

RECIPES = ("delayed", "current", "block", "mxfp8")
HOPPER = CapabilityFacts(te_available=True, te_import_error=None, cuda_available=True, device_name="H100 (injected)",
                         compute_capability=(9, 0), bf16_supported=True, recipes={r: (True, "") for r in RECIPES})
ARGS = dict(use_fp8=True, fp8_margin=1, fp8_amax_history_len=16, fp8_amax_compute_algo="most_recent", fp8_format="e4m3",
            fp8_min_gemm_dim=0)  # medium (1024 wide) is below the default small-GEMM threshold


@pytest.mark.parametrize("recipe", RECIPES)
def test_build_recipe_gives_te_objects_with_every_configured_value(recipe):
    rec = build_recipe(PrecisionArgs(fp8_recipe=recipe, **ARGS))
    fmt = _te.te_recipe.Format.E4M3
    expected = {"delayed": ("DelayedScaling", dict(margin=1, fp8_format=fmt, amax_history_len=16,
                                                   amax_compute_algo="most_recent")),
                "current": ("Float8CurrentScaling", dict(fp8_format=fmt)),
                "block": ("Float8BlockScaling", dict(fp8_format=fmt)),
                "mxfp8": ("MXFP8BlockScaling", dict(margin=1, fp8_format=fmt))}[recipe]
    assert type(rec).__name__ == expected[0] and isinstance(rec, getattr(_te.te_recipe, expected[0]))
    assert {k: getattr(rec, k) for k in expected[1]} == expected[1]


@pytest.mark.parametrize("recipe", RECIPES)
def test_accelerate_builds_a_real_te_recipe_from_our_kwargs(monkeypatch, recipe):
    """accelerate's own `apply_fp8_autowrap` (what `prepare()` runs for an FP8 Accelerator) accepts
    `TERecipeKwargs(**te_recipe_kwargs(args))` and hands them to TE's real recipe classes; yxanul then
    removes that wrapper. The recipe accelerate built is read from the wrapper's closure."""
    import accelerate.utils.transformer_engine as ate
    import transformer_engine.pytorch.fp8 as te_fp8
    from accelerate.utils import TERecipeKwargs

    monkeypatch.setattr(te_fp8, "check_mxfp8_support", lambda: (True, ""))   # hardware fact: Blackwell
    args = PrecisionArgs(fp8_recipe=recipe, **ARGS)
    model = YxanulForCausalLM(config_from_preset("nano", 1000, 32, backend="torch"))
    ate.apply_fp8_autowrap(model, TERecipeKwargs(**te_recipe_kwargs(args)))
    built = inspect.getclosurevars(model.forward.__func__).nonlocals["fp8_recipe"]
    if recipe == "mxfp8":
        assert isinstance(built, _te.te_recipe.MXFP8BlockScaling) and built.margin == 1
    else:  # accelerate can only express DelayedScaling; drops 'most_recent' (its default) - hence yxanul's own
        assert isinstance(built, _te.te_recipe.DelayedScaling)
        assert (built.margin, built.amax_history_len) == (1, 16)
    assert built.fp8_format == _te.te_recipe.Format.E4M3
    assert unwrap_accelerate_fp8(model) == 1 and "forward" not in model.__dict__


def test_fp8_plan_on_the_real_te_tree(monkeypatch):
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    config = config_from_preset("medium", 8192, 256, backend="te")
    plan = resolve_precision(PrecisionArgs(fp8_keep_bf16=["model.layers.0.*"], **ARGS), config, HOPPER)
    assert plan.fp8_enabled and isinstance(plan.recipe, _te.te_recipe.DelayedScaling)
    assert plan.recipe.amax_compute_algo == "most_recent"   # what accelerate alone would have dropped
    kw = plan.accelerator_kwargs()
    assert kw["mixed_precision"] == "fp8" and type(kw["kwargs_handlers"][0]).__name__ == "TERecipeKwargs"
    with torch.device("meta"):
        model = YxanulForCausalLM(config)
    plan.prepare_model(model, say=lambda *_: None)
    kept = {n for n, (_, fp8, _) in plan.decisions.items() if not fp8}
    assert kept == {"model.layers.0.self_attention.layernorm_qkv", "model.layers.0.self_attention.proj",
                    "model.layers.0.layernorm_mlp"}
    modules = dict(model.named_modules())
    assert all(modules[n]._yx_fp8 is False and "forward" in modules[n].__dict__ for n in kept)
    assert all(modules[n]._forward_hooks for n in plan.decisions)          # TE read-back hooks
    rep = precision_report(model, plan)
    assert rep["layers_source"] == "plan" and rep["backend"] == "te"
    assert {k: (v["fp8"], v[rep["base_dtype"]]) for k, v in rep["layers"].items()} == {
        "qkv": (23, 1), "proj": (23, 1), "mlp": (23, 1), "lm_head": (0, 1)}
    text = format_report(rep)
    assert "configured: DelayedScaling(margin=1" in text and "TE read-back: pending" in text
    plan.after_prepare(model)  # nothing replaced, head still tied
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_accelerates_convert_model_leaves_the_te_tree_alone(monkeypatch):
    """An FP8 Accelerator's `prepare()` runs accelerate's `convert_model` on the model unconditionally
    (accelerate 1.15 `_prepare_te`), swapping every `nn.Linear` / `nn.LayerNorm` for a new, untied TE
    module. yxanul's TE model has none (the LM head is an `LMHead`, norms are TE's), so the real
    `convert_model` changes nothing and `after_prepare` agrees."""
    from accelerate.utils.transformer_engine import convert_model

    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    config = config_from_preset("medium", 8192, 256, backend="te")
    plan = resolve_precision(PrecisionArgs(**ARGS), config, HOPPER)
    with torch.device("meta"):
        model = YxanulForCausalLM(config)
    plan.prepare_model(model, say=lambda *_: None)
    before = {n: type(m) for n, m in model.named_modules()}
    params = {n: p for n, p in model.named_parameters()}
    with torch.no_grad():
        convert_model(model)
    assert {n: type(m) for n, m in model.named_modules()} == before
    assert all(p is params[n] for n, p in model.named_parameters())
    plan.after_prepare(model)


def test_fp8_weight_all_gather_builds_every_te_gemm_weight_in_fp8(monkeypatch):
    """`weight_init()` is TE's quantized_model_init with the plan's recipe: the TE modules built inside
    hold FP8 primary weights (TE's own flag, read back), those built after do not; a plan without the
    setting leaves the build alone. (The weights themselves are quantized on a GPU: tests/training/test_fsdp.py.)"""
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    config = config_from_preset("medium", 8192, 256, backend="te", fuse_qkv_params=True)  # TE: no FP8 q/k/v split
    plan = resolve_precision(PrecisionArgs(fp8_weight_all_gather=True, fp8_recipe="current", **ARGS), config, HOPPER)
    plain = resolve_precision(PrecisionArgs(**ARGS), config, HOPPER)
    assert plan.fp8_weights and plain.fp8_enabled and not plain.fp8_weights

    def te_modules(model):
        base = _te.te.module.base.TransformerEngineBaseModule
        return [m for m in model.modules() if isinstance(m, base) and m.param_init_meta]

    with torch.device("meta"), plan.weight_init():
        mgr = _te._state_manager()
        assert mgr.with_fp8_parameters() and isinstance(mgr.get_fp8_recipe(), _te.te_recipe.Float8CurrentScaling)
        fp8 = YxanulForCausalLM(config)
    with torch.device("meta"), plain.weight_init():
        bf16 = YxanulForCausalLM(config)
    assert len(te_modules(fp8)) == 3 * config.num_hidden_layers  # qkv, proj, mlp of each layer
    assert all(m.primary_weights_in_fp8 for m in te_modules(fp8))
    assert not any(m.primary_weights_in_fp8 for m in te_modules(bf16))
    plan.prepare_model(fp8, say=pytest.fail)  # what the trainer does next: every TE layer planned FP8
    assert plan.decisions and all(fp8_on for _, fp8_on, _ in plan.decisions.values())
    assert not _te._state_manager().with_fp8_parameters()
    qkv = "model.layers.0.self_attention.layernorm_qkv."
    # the FP8 model saves its fused QKV weight as it is (the checkpoint readers split it); BF16 splits on save
    assert qkv + "weight" in fp8.state_dict() and qkv + "query_weight" not in fp8.state_dict()
    assert qkv + "query_weight" in bf16.state_dict() and qkv + "weight" not in bf16.state_dict()
