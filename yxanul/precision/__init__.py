"""Precision: BF16/FP32, and FP8 through Transformer Engine that is on for real or off with a reason.

Trainer protocol (docs/fp8.md):

    plan = resolve_precision(cfg.precision, model.config)        # before the Accelerator; may print 1 line
    accelerator = Accelerator(**plan.accelerator_kwargs(), ...)   # "fp8" + TERecipeKwargs for FP8 plans
    plan.prepare_model(model)                                     # policy, read-back hooks, no pickles
    model, opt = accelerator.prepare(model, opt)
    plan.after_prepare(model)                                     # drop accelerate FP8 wrappers, check tie
    with plan.forward_context(training=True):
        loss = model(x, shift_labels=y, is_first_microbatch=plan.is_first_microbatch(micro)).loss
"""

from .args import DEFAULT_MIN_GEMM_DIM, PrecisionArgs
from .plan import (CapabilityFacts, PrecisionPlan, build_recipe, decide, probe_facts, recipe_spec,
                   resolve_precision, te_recipe_kwargs, unwrap_accelerate_fp8)
from .policy import KINDS, gemm_shapes, layer_policy, module_decisions
from .report import format_report, precision_report
from .stats import fp8_stats

__all__ = ["DEFAULT_MIN_GEMM_DIM", "KINDS", "CapabilityFacts", "PrecisionArgs", "PrecisionPlan", "build_recipe",
           "decide", "format_report", "fp8_stats", "gemm_shapes", "layer_policy", "module_decisions",
           "precision_report", "probe_facts", "recipe_spec", "resolve_precision", "te_recipe_kwargs", "unwrap_accelerate_fp8"]
