"""Precision decisions on injected machine facts, recipe mapping, small-GEMM policy, report."""

import pytest

from yxanul.errors import UserError
from yxanul.models import YxanulForCausalLM, config_from_preset
from yxanul.precision import (CapabilityFacts, PrecisionArgs, decide, format_report, layer_policy,
                              precision_report, recipe_spec, resolve_precision)

H100 = CapabilityFacts(te_available=True, te_import_error=None, cuda_available=True, device_name="NVIDIA H100 80GB HBM3",
                       compute_capability=(9, 0), bf16_supported=True,
                       recipes={"delayed": (True, ""), "current": (True, ""), "block": (True, ""),
                                "mxfp8": (False, "MXFP8 needs compute capability 10.0+")})


def facts(**kw):
    return CapabilityFacts(**{**H100.__dict__, **kw})


def te_cfg(preset="medium", **kw):
    cfg = config_from_preset(preset, 50257, 1024, **kw)
    cfg.backend = "te"
    return cfg


@pytest.mark.parametrize("f,reason", [
    (facts(te_available=False, te_import_error="RuntimeError: cudnn shared object not found"), "cudnn shared object"),
    (facts(cuda_available=False, compute_capability=None), "no CUDA device"),
    (facts(compute_capability=(8, 0), device_name="A100"), "compute capability 8.0 < 8.9"),
])
def test_fallback_reasons(f, reason):
    ok, why = decide(PrecisionArgs(use_fp8=True), te_cfg(), f)
    assert not ok and reason in why


def test_fp8_on_when_possible_and_reasons_for_recipe_and_backend():
    assert decide(PrecisionArgs(use_fp8=True), te_cfg(), H100) == (True, None)
    ok, why = decide(PrecisionArgs(use_fp8=True, fp8_recipe="mxfp8"), te_cfg(), H100)
    assert not ok and "mxfp8" in why and "10.0" in why
    torch_cfg = config_from_preset("medium", 50257, 1024)
    ok, why = decide(PrecisionArgs(use_fp8=True), torch_cfg, H100)
    assert not ok and "backend is 'torch'" in why
    assert decide(PrecisionArgs(use_fp8=False), te_cfg(), H100) == (False, None)


def test_fallback_prints_one_line_and_require_fp8_raises():
    lines = []
    plan = resolve_precision(PrecisionArgs(use_fp8=True), te_cfg(), facts(cuda_available=False), say=lines.append)
    assert plan.label == "BF16" and not plan.fp8_enabled
    assert len(lines) == 1 and lines[0].startswith("FP8 off: no CUDA device")
    with pytest.raises(UserError, match="require_fp8.*no CUDA device"):
        resolve_precision(PrecisionArgs(require_fp8=True), te_cfg(), facts(cuda_available=False), say=lines.append)


def test_auto_base_precision():
    cpu = facts(cuda_available=False, bf16_supported=False, te_available=False)
    assert resolve_precision(PrecisionArgs(), te_cfg(), cpu).label == "FP32"
    assert resolve_precision(PrecisionArgs(), te_cfg(), H100).label == "BF16"
    assert resolve_precision(PrecisionArgs(), te_cfg(), cpu).accelerator_kwargs() == {"mixed_precision": "no"}


def test_recipe_mapping_carries_every_value():
    name, kw = recipe_spec(PrecisionArgs(fp8_format="e4m3", fp8_margin=2, fp8_amax_history_len=16,
                                         fp8_amax_compute_algo="most_recent"))
    assert name == "DelayedScaling"
    assert kw == {"margin": 2, "fp8_format": "E4M3", "amax_history_len": 16, "amax_compute_algo": "most_recent"}
    assert recipe_spec(PrecisionArgs(fp8_recipe="current"))[0] == "Float8CurrentScaling"
    assert recipe_spec(PrecisionArgs(fp8_recipe="block"))[0] == "Float8BlockScaling"
    assert recipe_spec(PrecisionArgs(fp8_recipe="mxfp8")) == ("MXFP8BlockScaling", {"fp8_format": "HYBRID"})


def test_small_gemm_policy_on_real_presets():
    small = layer_policy(te_cfg("gpt2-124m"), PrecisionArgs())          # 768 wide: everything BF16
    assert not any(ok for ok, _ in small.values())
    ok, why = decide(PrecisionArgs(use_fp8=True), te_cfg("gpt2-124m"), H100)
    assert not ok and "small-GEMM policy" in why
    big = layer_policy(te_cfg("xlarge"), PrecisionArgs())               # 1920 wide: all FP8 but the head
    assert big["qkv"][0] and big["proj"][0] and big["mlp"][0] and not big["lm_head"][0]
    forced = layer_policy(te_cfg("gpt2-124m"), PrecisionArgs(fp8_min_gemm_dim=0))
    assert forced["mlp"][0] and not forced["lm_head"][0]
    odd = layer_policy(te_cfg("tiny", intermediate_size=700), PrecisionArgs(fp8_min_gemm_dim=0))
    assert not odd["mlp"][0] and "multiple of 16" in odd["mlp"][1]


def test_fp8_interval_warns():
    lines = []
    resolve_precision(PrecisionArgs(fp8_interval=4), te_cfg(), H100, say=lines.append)
    assert any("fp8_interval=4 has no effect" in line for line in lines)


def test_report_from_a_torch_model():
    model = YxanulForCausalLM(config_from_preset("tiny", 1000, 32))
    plan = resolve_precision(PrecisionArgs(use_fp8=True), model.config,
                             facts(cuda_available=False, bf16_supported=False), say=lambda *a: None)
    rep = precision_report(model, plan)
    assert rep["precision"] == "FP32" and rep["fp8_requested"] and not rep["fp8"]
    assert rep["layers"]["qkv"] == {"fp8": 0, "bf16": 4, "why": "no CUDA device"}
    text = format_report(rep)
    assert "FP8 requested but off: no CUDA device" in text and "lm_head" in text
    assert plan.forward_context(training=True).__class__.__name__ == "nullcontext"
    assert plan.is_first_microbatch(0) is None and plan.fp8_stats(model) == {}
