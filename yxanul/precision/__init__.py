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

from .._lazy import lazy_exports

_WHERE = {
    "DEFAULT_MIN_GEMM_DIM": "args", "PrecisionArgs": "args", "CapabilityFacts": "plan",
    "PrecisionPlan": "plan", "build_recipe": "plan", "decide": "plan", "probe_facts": "plan",
    "recipe_spec": "plan", "resolve_precision": "plan", "te_recipe_kwargs": "plan",
    "unwrap_accelerate_fp8": "plan", "KINDS": "policy", "gemm_shapes": "policy", "layer_policy": "policy",
    "module_decisions": "policy", "format_report": "report", "precision_report": "report",
    "fp8_stats": "stats",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
