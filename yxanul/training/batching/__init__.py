"""Batching: the batch plan (micro-batch x accumulation x world toward a target), the adaptive
micro-batch search with a real training probe, its cache, the per-stage plans of a curriculum and
`yxanul find-batch` (finder.py)."""

from ..._lazy import lazy_exports

_WHERE = {
    "FP8_TOKEN_ALIGN": "args", "BatchArgs": "args", "fp8_micro_multiple": "args", "micro_multiple": "args",
    "cache_fields": "cache", "cache_files": "cache", "cache_key": "cache", "get_or_find": "cache",
    "user_cache_file": "cache", "BatchPlan": "plan", "plan_batch": "plan", "TrainingProbe": "probe",
    "NoFitError": "search", "SearchResult": "search", "apply_margin": "search", "default_is_oom": "search",
    "find_micro_batch": "search", "free_memory": "search", "torch_reduce_min": "search",
    "find_micro": "finder", "plan_curriculum": "finder", "precision_label": "finder", "resolve_batch": "finder",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
