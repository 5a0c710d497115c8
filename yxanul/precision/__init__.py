"""Precision: BF16/FP32, and FP8 through Transformer Engine that is on for real or off with a reason."""

from .args import PrecisionArgs
from .plan import CapabilityFacts, PrecisionPlan, decide, layer_policy, probe_facts, recipe_spec, resolve_precision
from .report import format_report, fp8_stats, precision_report

__all__ = ["PrecisionArgs", "CapabilityFacts", "PrecisionPlan", "decide", "layer_policy", "probe_facts",
           "recipe_spec", "resolve_precision", "format_report", "fp8_stats", "precision_report"]
