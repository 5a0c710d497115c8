"""Importing DeepSpeed without its CPU notice: its import logs "Setting accelerator to CPU ..." on every
machine without a GPU, and accelerate imports it in every run (``unwrap_model``) and every Trainer. Both
trainers (`yxanul train`, YxanulTrainer) import it here first. Here too: torch's deprecation warnings for the
collectives DeepSpeed calls, which no yxanul user can act on."""

from __future__ import annotations

import logging
import warnings

DEEPSPEED_CPU_NOTICE = "Setting accelerator to CPU"
# torch deprecated the collectives ZeRO calls for every parameter all-gather and gradient reduce-scatter: a
# FutureWarning per call site, shown again each step (torch attributes it to its own c10d_logger, so no filter
# by DeepSpeed's module can match) on every rank: ~500 lines of an 8-step ZeRO-3 run. Only DeepSpeed can change
# the calls; only these two messages are dropped.
DEPRECATED_COLLECTIVES = r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated"


class _DropCpuNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(DEEPSPEED_CPU_NOTICE)


def import_deepspeed_quietly() -> None:
    """Import DeepSpeed (when installed) without its "Setting accelerator to CPU ..." warning, which its
    import logs on every machine without a GPU: accelerate imports it anyway (``unwrap_model``, every
    run). Only that one message is dropped, and only during the import; its logger is "DeepSpeed". From then
    on torch's deprecation warnings of the two collectives DeepSpeed calls are ignored (DEPRECATED_COLLECTIVES)."""
    import importlib.util
    import sys

    if "deepspeed" not in sys.modules and importlib.util.find_spec("deepspeed") is None:
        return
    warnings.filterwarnings("ignore", message=DEPRECATED_COLLECTIVES, category=FutureWarning)
    if "deepspeed" in sys.modules:
        return
    drop, ds_logger = _DropCpuNotice(), logging.getLogger("DeepSpeed")
    ds_logger.addFilter(drop)
    try:
        import deepspeed  # noqa: F401
    finally:
        ds_logger.removeFilter(drop)
