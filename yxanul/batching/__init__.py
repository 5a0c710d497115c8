"""Batching: the batch plan (micro-batch x accumulation x world toward a target), the adaptive
micro-batch search with a real training probe, and its cache. CLI and trainer glue: yxanul.batch_finder."""

from .args import FP8_TOKEN_ALIGN, BatchArgs, fp8_micro_multiple, micro_multiple
from .cache import cache_fields, cache_files, cache_key, get_or_find, user_cache_file
from .plan import BatchPlan, plan_batch
from .probe import TrainingProbe, make_training_probe, probe_context
from .search import NoFitError, SearchResult, apply_margin, default_is_oom, find_micro_batch, free_memory, torch_reduce_min

__all__ = ["FP8_TOKEN_ALIGN", "BatchArgs", "BatchPlan", "NoFitError", "SearchResult", "TrainingProbe", "apply_margin",
           "cache_fields", "cache_files", "cache_key", "default_is_oom", "find_micro_batch", "fp8_micro_multiple",
           "free_memory", "get_or_find", "make_training_probe", "micro_multiple", "plan_batch", "probe_context",
           "torch_reduce_min", "user_cache_file"]
