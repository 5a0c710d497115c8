"""Precision decisions on injected machine facts, recipe mapping, config validation, plan protocol."""

import pytest

from yxanul.errors import ConfigError, UserError
from yxanul.models import config_from_preset
from yxanul.precision import CapabilityFacts, PrecisionArgs, decide, recipe_spec, resolve_precision

H100 = CapabilityFacts(te_available=True, te_import_error=None, cuda_available=True,
                       device_name="NVIDIA H100 80GB HBM3",
                       compute_capability=(9, 0), bf16_supported=True,
                       recipes={"delayed": (True, ""), "current": (True, ""), "block": (True, ""),
                                "mxfp8": (False,
                                          "Device compute capability 10.0 or higher required for MXFP8 execution.")})


def facts(**kw):
    return CapabilityFacts(**{**H100.__dict__, **kw})


def te_cfg(preset="large", **kw):  # 1536 wide: FP8 under the default small-GEMM policy
    cfg = config_from_preset(preset, 50257, 1024, **kw)
    cfg.backend = "te"
    return cfg


@pytest.mark.parametrize("f,reason", [
    (facts(te_available=False, te_import_error="RuntimeError: cudnn shared object not found"), "cudnn shared object"),
    (facts(cuda_available=False, compute_capability=None), "no CUDA device"),
    (facts(compute_capability=(8, 0), device_name="A100"), "compute capability 8.0 < 8.9 (A100)"),
    (facts(compute_capability=(8, 6), device_name="RTX 3090"), "compute capability 8.6 < 8.9"),
    (facts(recipes={**H100.recipes, "delayed": (False, "CublasLt version 12.1.3.x or higher required")}),
     "recipe 'delayed' not available: CublasLt"),
    (facts(recipes={}), "recipe 'delayed' not available"),
])
def test_each_fallback_reason(f, reason):
    ok, why = decide(PrecisionArgs(use_fp8=True), te_cfg(), f)
    assert not ok and reason in why


def test_fp8_on_when_possible_and_reasons_for_recipe_backend_and_dims():
    assert decide(PrecisionArgs(use_fp8=True), te_cfg(), H100) == (True, None)
    assert decide(PrecisionArgs(use_fp8=True), te_cfg(), facts(compute_capability=(8, 9), device_name="L4")) \
        == (True, None)
    ok, why = decide(PrecisionArgs(use_fp8=True, fp8_recipe="mxfp8"), te_cfg(), H100)
    assert not ok and "mxfp8" in why and "10.0" in why
    ok, why = decide(PrecisionArgs(use_fp8=True), config_from_preset("medium", 50257, 1024), H100)
    assert not ok and "backend is 'torch'" in why
    ok, why = decide(PrecisionArgs(use_fp8=True, fp8_min_gemm_dim=0), te_cfg("nano", intermediate_size=700,
                                                                            hidden_size=264, num_attention_heads=4),
                     H100)
    assert not ok and "not a multiple of 16" in why
    assert decide(PrecisionArgs(use_fp8=False), te_cfg(), H100) == (False, None)


def test_fallback_prints_one_line_and_require_fp8_raises_one_line():
    lines = []
    plan = resolve_precision(PrecisionArgs(use_fp8=True), te_cfg(), facts(compute_capability=(8, 0)), say=lines.append)
    assert plan.label == "BF16" and not plan.fp8_enabled and plan.recipe is None
    assert lines == ["FP8 off: compute capability 8.0 < 8.9 (NVIDIA H100 80GB HBM3): FP8 needs Ada, Hopper or "
                     "Blackwell; training in BF16"]
    with pytest.raises(UserError, match="require_fp8: FP8 is impossible here: no CUDA device") as e:
        resolve_precision(PrecisionArgs(require_fp8=True), te_cfg(), facts(cuda_available=False), say=lines.append)
    assert "\n" not in str(e.value)


def test_base_precision_and_accelerator_kwargs():
    cpu = facts(cuda_available=False, bf16_supported=False, te_available=False, compute_capability=None)
    assert resolve_precision(PrecisionArgs(), te_cfg(), cpu).label == "FP32"
    assert resolve_precision(PrecisionArgs(), te_cfg(), cpu).accelerator_kwargs() == {"mixed_precision": "no"}
    assert resolve_precision(PrecisionArgs(), te_cfg(), H100).label == "BF16"
    assert resolve_precision(PrecisionArgs(mixed_precision="bf16"), te_cfg(), cpu).label == "BF16"
    assert resolve_precision(PrecisionArgs(mixed_precision="fp32"), te_cfg(), H100).label == "FP32"


def test_recipe_mapping_carries_every_value():
    name, kw = recipe_spec(PrecisionArgs(fp8_format="e4m3", fp8_margin=2, fp8_amax_history_len=16,
                                         fp8_amax_compute_algo="most_recent"))
    assert (name, kw) == ("DelayedScaling", {"margin": 2, "fp8_format": "E4M3", "amax_history_len": 16,
                                             "amax_compute_algo": "most_recent"})
    assert recipe_spec(PrecisionArgs(fp8_recipe="current")) == ("Float8CurrentScaling", {"fp8_format": "HYBRID"})
    assert recipe_spec(PrecisionArgs(fp8_recipe="block", fp8_format="e4m3")) == ("Float8BlockScaling",
                                                                                 {"fp8_format": "E4M3"})
    assert recipe_spec(PrecisionArgs(fp8_recipe="mxfp8", fp8_margin=1)) == ("MXFP8BlockScaling",
                                                                           {"margin": 1, "fp8_format": "HYBRID"})
    # fp8_attention: TE's fp8_dpa on the two recipes that take it
    assert recipe_spec(PrecisionArgs(use_fp8=True, fp8_attention=True))[1]["fp8_dpa"] is True
    assert recipe_spec(PrecisionArgs(use_fp8=True, fp8_recipe="current", fp8_attention=True)) == (
        "Float8CurrentScaling", {"fp8_format": "HYBRID", "fp8_dpa": True})


@pytest.mark.parametrize("kw,key", [({"fp8_margin": -1}, "fp8_margin"), ({"fp8_interval": 0}, "fp8_interval"),
                                    ({"fp8_amax_history_len": 0}, "fp8_amax_history_len"),
                                    ({"fp8_min_gemm_dim": -16}, "fp8_min_gemm_dim"),
                                    ({"use_fp8": True, "fp8_format": "e5m2"}, "fp8_format"),
                                    ({"require_fp8": True, "mixed_precision": "fp32"}, "mixed_precision"),
                                    ({"fp8_keep_bf16": "model.layers.0.*"}, "fp8_keep_bf16"),
                                    ({"fp8_keep_bf16": [""]}, "fp8_keep_bf16"),
                                    ({"use_fp8": True, "fp8_recipe": "mxfp8", "fp8_attention": True},
                                     "fp8_attention': expected false with fp8_recipe mxfp8")])
def test_args_validation(kw, key):
    with pytest.raises(ConfigError, match=key):
        PrecisionArgs(**kw)


def test_args_have_help_and_require_implies_use():
    import dataclasses

    assert all(f.metadata.get("help") for f in dataclasses.fields(PrecisionArgs))
    assert PrecisionArgs(require_fp8=True).use_fp8


def test_fp8_interval_is_recorded_and_warned():
    lines = []
    plan = resolve_precision(PrecisionArgs(use_fp8=True, fp8_interval=4), te_cfg(), facts(cuda_available=False),
                             say=lines.append)
    assert any("fp8_interval=4 has no effect" in line for line in lines)
    assert plan.metadata()["fp8"] is False and plan.metadata()["fp8_fallback_reason"] == "no CUDA device"


def test_plan_protocol_without_fp8():
    plan = resolve_precision(PrecisionArgs(), te_cfg(), facts(cuda_available=False, bf16_supported=False))
    assert plan.forward_context(training=True).__class__.__name__ == "nullcontext"
    assert plan.is_first_microbatch(0) is None and plan.is_first_microbatch(3) is None
    assert plan.metadata() == {"fp8": False, "mixed_precision": "fp32", "fp8_recipe": None,
                               "fp8_recipe_kwargs": None, "fp8_fallback_reason": None}


def test_fp8_weight_all_gather_needs_fp8_on_and_every_te_layer_in_fp8():
    """FP8 weights are built for every TE GEMM: with FP8 off (one line with the reason) or a layer kept
    BF16 by the small-GEMM policy or fp8_keep_bf16 (it would compute in BF16 from FP8-rounded weights),
    the run refuses before the model is built. The plan that builds them: tests/precision/test_plan_te.py."""
    args = dict(use_fp8=True, fp8_weight_all_gather=True)
    with pytest.raises(ConfigError, match=r"'fp8_weight_all_gather': expected false here: FP8 is off \(no CUDA"):
        resolve_precision(PrecisionArgs(**args), te_cfg(), facts(cuda_available=False), say=pytest.fail)
    with pytest.raises(ConfigError, match=r"every TE layer in FP8, but the policy keeps some BF16: mlp \(GEMM "
                                          r".*4100 is not a multiple of 16.*\) \(set fp8_min_gemm_dim 0"):
        resolve_precision(PrecisionArgs(**args, fp8_min_gemm_dim=0), te_cfg(intermediate_size=4100), H100)
    with pytest.raises(ConfigError, match=r"FP8 is off \(no layer passes the small-GEMM policy"):
        resolve_precision(PrecisionArgs(**args), te_cfg("gpt2-124m"), H100)  # 768 wide < 1536
    with pytest.raises(ConfigError, match=r"fp8_keep_bf16 \['model.layers.0.\*'\]"):
        resolve_precision(PrecisionArgs(**args, fp8_keep_bf16=["model.layers.0.*"]), te_cfg(), H100, say=print)


def test_fp8_attention_with_current_scaling_below_sm100_is_refused_in_one_line():
    """TE 2.20 runs FP8 attention for current scaling on sm_100+ only: on an H100/H200 every backend is off and
    the first forward raised "No dot product attention backend is available" (the H200 lease of 2026-11-27)."""
    args = PrecisionArgs(use_fp8=True, fp8_recipe="current", fp8_attention=True)
    with pytest.raises(ConfigError, match="^config key 'fp8_attention': expected false with fp8_recipe current on "
                                          "NVIDIA H100"):
        resolve_precision(args, te_cfg(), H100, say=lambda *a: None)
    from yxanul.precision.plan import check_fp8_attention  # what resolve_precision runs once FP8 is on

    check_fp8_attention(args, facts(compute_capability=(10, 0), device_name="NVIDIA B200"), te_cfg())
    check_fp8_attention(PrecisionArgs(use_fp8=True, fp8_recipe="delayed", fp8_attention=True), H100, te_cfg())
    check_fp8_attention(PrecisionArgs(use_fp8=True, fp8_recipe="current"), H100, te_cfg())


def test_fp8_attention_below_sm100_needs_head_dim_128():
    """cuDNN's FP8 attention, the only backend TE 2.20 trains FP8 attention with, takes head_dim 128 below sm_100
    (the H200's "No dot product attention backend" at gpt2-124m, head_dim 64, with delayed scaling); from sm_100
    on, head_dim <= 128 in multiples of 16. `large` (1536 / 12) is 128 wide, `gpt2-124m` and `medium` 64."""
    from yxanul.precision.plan import check_fp8_attention

    delayed = PrecisionArgs(use_fp8=True, fp8_recipe="delayed", fp8_attention=True)
    assert te_cfg("gpt2-124m").head_dim == te_cfg("medium").head_dim == 64 and te_cfg("xlarge").head_dim == 128
    for preset in ("gpt2-124m", "medium"):
        with pytest.raises(ConfigError, match="^config key 'fp8_attention': expected false for head_dim 64 on NVIDIA "
                                              "H100 .*takes head_dim 128 below compute capability 10.0"):
            check_fp8_attention(delayed, H100, te_cfg(preset))
    with pytest.raises(ConfigError, match="^config key 'fp8_attention': expected false for head_dim 64"):
        resolve_precision(PrecisionArgs(use_fp8=True, fp8_attention=True, fp8_min_gemm_dim=0), te_cfg("gpt2-124m"),
                          H100, say=lambda *a: None)
    for preset in ("large", "xlarge", "3b"):
        check_fp8_attention(delayed, H100, te_cfg(preset))
    b200 = facts(compute_capability=(10, 0), device_name="NVIDIA B200")
    check_fp8_attention(delayed, b200, te_cfg("gpt2-124m"))
    with pytest.raises(ConfigError, match="head_dim 72 on NVIDIA B200 .*head_dim <= 128, a multiple of 16"):
        check_fp8_attention(delayed, b200, te_cfg("medium-large", num_attention_heads=16, num_key_value_heads=16))
    check_fp8_attention(PrecisionArgs(use_fp8=True, fp8_recipe="delayed"), H100, te_cfg("gpt2-124m"))  # flag off


def test_bf16_on_a_cpu_without_onednn_bf16_kernels_is_one_warning():
    """An AVX2-only CPU runs BF16 matmuls on torch's reference path (a nano step ~40x FP32's): one line says so
    and names --mixed_precision fp32; a CPU with the kernels, a GPU, and FP32 say nothing."""
    cpu = facts(cuda_available=False, bf16_supported=False, te_available=False, compute_capability=None)
    said = []
    resolve_precision(PrecisionArgs(mixed_precision="bf16"), te_cfg(), facts(**{**cpu.__dict__, "cpu_bf16_gemm":
                                                                                False}), say=said.append)
    assert len(said) == 1 and said[0].startswith("warning: BF16 on this CPU is slow") and "fp32" in said[0], said
    for f, precision in ((cpu, "bf16"), (facts(cpu_bf16_gemm=False), "bf16"),
                         (facts(**{**cpu.__dict__, "cpu_bf16_gemm": False}), "fp32")):
        said = []
        resolve_precision(PrecisionArgs(mixed_precision=precision), te_cfg(), f, say=said.append)
        assert said == [], (f, precision, said)
