"""Small-GEMM policy on the real presets, and the report from a torch-backend model."""

import json

import pytest
import torch

from yxanul.models import PRESETS, YxanulForCausalLM, config_from_preset
from yxanul.precision import (
    CapabilityFacts,
    PrecisionArgs,
    format_report,
    layer_policy,
    module_decisions,
    precision_report,
    resolve_precision,
)

CPU = CapabilityFacts(te_available=False, te_import_error="ModuleNotFoundError: No module named 'transformer_engine'",
                      cuda_available=False)


def cfg(preset, **kw):
    return config_from_preset(preset, 50257, 1024, **kw)


@pytest.mark.parametrize("preset,expect", [
    ("nano", False), ("tiny", False), ("gpt2-124m", False), ("small", False), ("medium", False),
    ("medium-large", False),                                                       # <= 1152 wide: BF16
    ("yxanul-0.6b", True), ("large", True), ("xlarge", True),                      # >= 1536: FP8 (H100 bench)
])
def test_default_policy_on_every_preset(preset, expect):
    pol = layer_policy(cfg(preset), PrecisionArgs())
    assert [pol[k][0] for k in ("qkv", "proj", "mlp")] == [expect] * 3, pol
    assert pol["lm_head"][0] is False


def test_policy_threshold_and_reasons():
    assert set(PRESETS) >= {"gpt2-124m", "medium", "xlarge"}
    small = layer_policy(cfg("gpt2-124m"), PrecisionArgs())
    assert "smallest dim 768 < fp8_min_gemm_dim 1536" in small["proj"][1]
    forced = layer_policy(cfg("gpt2-124m"), PrecisionArgs(fp8_min_gemm_dim=0))
    assert forced["mlp"][0] and forced["qkv"][0] and not forced["lm_head"][0]
    strict = layer_policy(cfg("yxanul-0.6b"), PrecisionArgs(fp8_min_gemm_dim=2048))   # 1536 wide, GQA
    assert not strict["qkv"][0] and "2560x1536" in strict["qkv"][1]
    odd = layer_policy(cfg("nano", intermediate_size=700), PrecisionArgs(fp8_min_gemm_dim=0))
    assert not odd["mlp"][0] and "700 is not a multiple of 16" in odd["mlp"][1]
    assert odd["qkv"][0]
    # 3088 = 16 x 193: fine for delayed/current/block, but MXFP8 needs multiples of 32
    mx = {r: layer_policy(cfg("medium", intermediate_size=3088),
                          PrecisionArgs(fp8_recipe=r, fp8_min_gemm_dim=0)) for r in ("delayed", "mxfp8")}
    assert mx["delayed"]["mlp"][0] and mx["mxfp8"]["qkv"][0]
    assert not mx["mxfp8"]["mlp"][0] and "3088 is not a multiple of 32 (TE mxfp8" in mx["mxfp8"]["mlp"][1]


def test_module_decisions_and_keep_bf16_patterns():
    model = YxanulForCausalLM(cfg("nano"))
    pol = layer_policy(model.config, PrecisionArgs(fp8_min_gemm_dim=0))
    d = module_decisions(model, pol, ["model.layers.0.*", "*.layers.3.layernorm_mlp"])
    assert len(d) == 3 * model.config.num_hidden_layers
    assert d["model.layers.0.self_attention.layernorm_qkv"][:2] == ("qkv", False)
    assert "fp8_keep_bf16 pattern 'model.layers.0.*'" in d["model.layers.0.layernorm_mlp"][2]
    assert d["model.layers.3.layernorm_mlp"][1] is False and d["model.layers.3.self_attention.proj"][1] is True
    assert d["model.layers.1.layernorm_mlp"] == ("mlp", True, pol["mlp"][1])


def test_report_from_a_torch_model_says_why():
    model = YxanulForCausalLM(cfg("nano"))
    lines = []
    plan = resolve_precision(PrecisionArgs(use_fp8=True), model.config, CPU, say=lines.append)
    plan.prepare_model(model)
    rep = precision_report(model, plan)
    json.dumps(rep)  # JSON-able for precision_report.json / trackers
    assert rep["precision"] == "FP32" and rep["fp8_requested"] and not rep["fp8"]
    assert rep["base_dtype"] == "fp32" and rep["layers"]["qkv"] == {"fp8": 0, "fp32": 4, "why": "no CUDA device"}
    assert rep["layers"]["lm_head"]["fp8"] == 0 and rep["layers_source"] == "n/a"
    text = format_report(rep)
    assert text.splitlines()[0] == "precision: FP32 (backend torch)"
    assert "FP8 requested but off: no CUDA device" in text and "lm_head" in text and "| FP32   4" in text
    assert plan.fp8_stats(model) == {}


def test_report_without_fp8_request():
    model = YxanulForCausalLM(cfg("nano"))
    plan = resolve_precision(PrecisionArgs(mixed_precision="bf16"), model.config, CPU)
    rep = precision_report(model, plan)
    assert rep["precision"] == "BF16" and rep["layers"]["mlp"]["why"] == "FP8 not requested"
    assert rep["base_dtype"] == "bf16" and rep["layers"]["mlp"]["bf16"] == 4 and "fp32" not in rep["layers"]["mlp"]
    assert "| BF16   4" in format_report(rep)
    assert "FP8 requested" not in format_report(rep)


def test_label_follows_te_readback_only():
    """An FP8 plan says FP8 only after TE confirmed it (read-back), never from the config."""
    from yxanul.precision.plan import PrecisionPlan
    from yxanul.precision.policy import layer_policy as lp
    from yxanul.precision.report import _finish

    c = cfg("large")
    args = PrecisionArgs(use_fp8=True)
    plan = PrecisionPlan.__new__(PrecisionPlan)
    plan.__dict__.update(args=args, fp8_enabled=True, fallback_reason=None, base="bf16", policy=lp(c, args),
                         facts=CPU, recipe_name="DelayedScaling", recipe_kwargs={}, recipe=object(), readback=None,
                         decisions={"a": ("qkv", True, ""), "b": ("mlp", False, "kept")})
    assert plan.label == "FP8?"
    _finish(plan, {"fp8_enabled": True, "recipe": "DelayedScaling", "fp8_format": "HYBRID"},
            {"a": ("qkv", True, "DelayedScaling"), "b": ("mlp", False, None)})
    assert plan.label == "FP8" and plan.readback["layers"]["qkv"] == {"fp8": 1, "bf16": 0}
    _finish(plan, {"fp8_enabled": False}, {"a": ("qkv", False, None), "b": ("mlp", False, None)})
    assert plan.label == "BF16" and not plan.readback["fp8_confirmed"]
    plan.args = PrecisionArgs(require_fp8=True)
    from yxanul.errors import UserError

    with pytest.raises(UserError, match="TE ran 0/1 planned FP8 modules"):
        _finish(plan, {"fp8_enabled": False}, {"a": ("qkv", False, None), "b": ("mlp", False, None)})


def test_meta_model_report_is_cheap():
    with torch.device("meta"):
        model = YxanulForCausalLM(cfg("xlarge"))
    plan = resolve_precision(PrecisionArgs(use_fp8=True), model.config, CPU, say=lambda *a: None)
    plan.prepare_model(model)
    assert precision_report(model, plan)["layers"]["mlp"]["fp32"] == 32  # CPU facts: auto -> fp32


def test_fp32_run_report_names_fp32_never_bf16(tmp_path, capsys):
    """`yxanul train --mixed_precision fp32`: precision_report.json counts its non-FP8 modules as fp32 (it
    said "bf16" for every run), top-level base_dtype fp32; the console table says FP32."""
    from yxanul.cli import main

    out = tmp_path / "run"
    assert main(["train", "--model", "nano", "--seq_length", "16", "--micro_batch_size", "2", "--max_steps", "1",
                 "--warmup_steps", "0", "--eval_freq", "0", "--eval_steps", "1", "--sample_tokens", "0",
                 "--checkpoint_freq", "0", "--use_tensorboard", "false", "--num_workers", "0",
                 "--mixed_precision", "fp32", "--output_dir", str(out)]) == 0
    rep = json.loads((out / "precision_report.json").read_text())
    assert rep["precision"] == "FP32" and rep["base_dtype"] == "fp32" and rep["non_fp8_precision"] == "FP32"
    assert {k: (d["fp8"], d["fp32"]) for k, d in rep["layers"].items()} == {
        "qkv": (0, 4), "proj": (0, 4), "mlp": (0, 4), "lm_head": (0, 1)}
    assert not any("bf16" in d for d in rep["layers"].values())
    assert "| FP32   4" in capsys.readouterr().out and "BF16" not in format_report(rep)
    from yxanul.hub.card import _precision_lines

    assert "  - mlp: 0 layers in FP8, 4 in FP32 (FP8 not requested)" in _precision_lines(rep)  # the model card
    old = {"precision": "BF16", "non_fp8_precision": "BF16", "layers": {"mlp": {"fp8": 2, "bf16": 2}}}
    assert _precision_lines(old)[-1] == "  - mlp: 2 layers in FP8, 2 in BF16"  # a report from before base_dtype
