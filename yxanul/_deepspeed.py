"""Importing DeepSpeed without its CPU notice: its import logs "Setting accelerator to CPU ..." on every
machine without a GPU, and accelerate imports it in every run (``unwrap_model``) and every Trainer. Both
trainers (`yxanul train`, YxanulTrainer) import it here first."""

from __future__ import annotations

import logging

DEEPSPEED_CPU_NOTICE = "Setting accelerator to CPU"


class _DropCpuNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(DEEPSPEED_CPU_NOTICE)


def import_deepspeed_quietly() -> None:
    """Import DeepSpeed (when installed) without its "Setting accelerator to CPU ..." warning, which its
    import logs on every machine without a GPU: accelerate imports it anyway (``unwrap_model``, every
    run). Only that one message is dropped, and only during the import; its logger is "DeepSpeed"."""
    import importlib.util
    import sys

    if "deepspeed" in sys.modules or importlib.util.find_spec("deepspeed") is None:
        return
    drop, ds_logger = _DropCpuNotice(), logging.getLogger("DeepSpeed")
    ds_logger.addFilter(drop)
    try:
        import deepspeed  # noqa: F401
    finally:
        ds_logger.removeFilter(drop)
