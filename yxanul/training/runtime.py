"""Pieces of a run around the loop: the step timer and the DeepSpeed config the trainer fills in."""

from __future__ import annotations

import time


class StepTimer:
    """Wall time per optimizer step between two logs; evaluation, saving and tracker start-up excluded."""

    def __init__(self):
        self.t0, self.steps = time.perf_counter(), 0

    def exclude(self, seconds: float) -> None:
        self.t0 += seconds

    def lap(self) -> float:
        """Seconds per step since the last lap; restarts the clock."""
        now = time.perf_counter()
        dt = (now - self.t0) / max(self.steps, 1)
        self.t0, self.steps = now, 0
        return dt


def configure_deepspeed(accelerator, cfg, micro: int, accum: int, say) -> None:
    """Under DeepSpeed: drop keys that only cost time (lint policy) and fill what accelerate would
    take from a prepared DataLoader (yxanul's loader is not prepared) or fill wrongly
    (``gradient_clipping: auto`` becomes 1.0 in accelerate, not ``max_grad_norm``)."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        return
    from ..lint import sanitize_deepspeed_config

    ds, warnings = sanitize_deepspeed_config(plugin.deepspeed_config)
    for w in warnings:
        say(f"warning: {w.line()} (removed for this run)")
    ds.update(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=accum,
              train_batch_size=micro * accum * accelerator.num_processes,
              gradient_clipping=cfg.optim.max_grad_norm)
    plugin.deepspeed_config.clear()
    plugin.deepspeed_config.update(ds)
