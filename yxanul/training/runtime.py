"""Pieces of a run around the loop: the step timer, the Accelerator (and the DeepSpeed config the
trainer fills in), ``--torch_compile``."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from .._deepspeed import import_deepspeed_quietly
from ..errors import ConfigError
from ..lint import sanitize_deepspeed_config
from ..tracking import tracker_names
from .fsdp import describe as describe_fsdp
from .fsdp import fsdp_plugin, mesh_after_fsdp_on_cpu, shard_on_cpu, sharding_facts


def quiet(*args, **kwargs) -> None:
    """``say`` of the processes that don't print."""


class StepTimer:
    """Wall time per optimizer step between two logs; evaluation, saving and tracker start-up excluded."""

    def __init__(self):
        self.t0, self.steps = time.perf_counter(), 0

    def exclude(self, seconds: float) -> None:
        self.t0 += seconds

    def peek(self) -> float | None:
        """Seconds per step since the last lap, without restarting the clock (None: no step yet)."""
        return (time.perf_counter() - self.t0) / self.steps if self.steps else None

    def lap(self) -> float:
        """Seconds per step since the last lap; restarts the clock."""
        now = time.perf_counter()
        dt = (now - self.t0) / max(self.steps, 1)
        self.t0, self.steps = now, 0
        return dt if dt > 0 else float("nan")  # a clock that did not advance: not measured (tok/sec: nan)


class UnwrapCache:
    """``accelerator.unwrap_model(model)``, computed again only when ``model`` is another object (compiled, prepared
    anew). accelerate's ``extract_model_from_parallel`` calls ``is_deepspeed_available()`` every time, which reads
    DeepSpeed's package metadata anew (0.4-0.7 ms a call where DeepSpeed is installed, ~97 % of a logged step's
    `Trainer.log`); what it unwraps (DDP, DeepSpeedEngine, FSDP, torch.compile's ``_orig_mod``) is fixed for one
    model object, so its answer is too."""

    def __init__(self):
        self.of = self.unwrapped = None

    def __call__(self, accelerator, model):
        if model is not self.of:
            self.unwrapped, self.of = accelerator.unwrap_model(model), model
        return self.unwrapped


def configure_deepspeed(accelerator, cfg, micro: int, accum: int, say) -> None:
    """Under DeepSpeed: drop keys that only cost time (lint policy) and fill what accelerate would
    take from a prepared DataLoader (yxanul's loader is not prepared) or fill wrongly
    (``gradient_clipping: auto`` becomes 1.0 in accelerate, not ``max_grad_norm``)."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        return

    ds, warnings = sanitize_deepspeed_config(plugin.deepspeed_config)
    for w in warnings:
        say(f"warning: {w.line()} (removed for this run)")
    ds.update(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=accum,
              train_batch_size=micro * accum * accelerator.num_processes,
              gradient_clipping=cfg.optim.max_grad_norm)
    plugin.deepspeed_config.clear()
    plugin.deepspeed_config.update(ds)


def build_accelerator(cfg, plan, run_dir: Path, batch, cpu: bool, say, model=None):
    """The run's Accelerator: the precision plan's kwargs, gradient accumulation, the trackers the
    config asks for (logging under ``RUN/tensorboard``); under DeepSpeed its config filled in; under an
    FSDP profile yxanul's FSDP2 plugin for ``model`` (training/fsdp.py)."""
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    import_deepspeed_quietly()
    plugin = fsdp_plugin(model, plan.base, plan.fp8_weights) if model is not None else None
    with mesh_after_fsdp_on_cpu(plugin, cpu) as deferred_mesh:
        acc = Accelerator(**plan.accelerator_kwargs(), gradient_accumulation_steps=batch.grad_accum,
                          log_with=tracker_names(cfg.tracking) or None,
                          project_config=ProjectConfiguration(project_dir=str(run_dir),
                                                              logging_dir=str(run_dir / "tensorboard")),
                          step_scheduler_with_optimizer=False, cpu=cpu, fsdp_plugin=plugin)
    shard_on_cpu(acc, plugin, deferred_mesh)
    if acc.is_fsdp2:
        plan.sharding = sharding_facts(acc, plan.fp8_weights)  # into the precision report
        say(describe_fsdp(plan.sharding))
    configure_deepspeed(acc, cfg, batch.micro_batch, batch.grad_accum, say)
    return acc


def weights_sharded(accelerator) -> bool:
    """Each process holds only a shard of the weights (DeepSpeed ZeRO-3, FSDP): a forward needs every
    process (so rank 0 cannot sample alone) and TE's FP8 weight cache would hold unsharded copies."""
    from accelerate.utils import DistributedType

    plugin = accelerator.state.deepspeed_plugin
    if plugin is not None:
        return plugin.zero_stage == 3
    return accelerator.distributed_type == DistributedType.FSDP


def compile_model(model, device_type: str, fp8_enabled: bool = False):
    """``--torch_compile``. On CPU, inductor's C++ codegen needs a compiler with OpenMP (missing on many
    machines, and CPU runs are for correctness, not speed): TorchDynamo + AOTAutograd without codegen.
    Refused with FP8 on: TorchDynamo fails on TE's FP8 weight tensors ("Guard failed on the same frame it
    was created" in QuantizedTensor.detach; TE 2.20.2, torch 2.11, an H200: docs/benchmarks.md)."""
    import torch

    if fp8_enabled:
        raise ConfigError("torch_compile", "false with FP8 (TorchDynamo cannot trace Transformer Engine's FP8 "
                                           "weights: use --cuda_graphs for the launch overhead)", True)
    return torch.compile(model, backend="inductor" if device_type == "cuda" else "aot_eager")


def process_state():
    """(cpu, accelerate's PartialState). On a CPU-only machine accelerate is told so (else torchrun'd
    ranks each become 'rank 0 of 1'), except under DeepSpeed, which accelerate disables when cpu=True."""
    import torch
    from accelerate import PartialState

    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"
    cpu = not torch.cuda.is_available() and not deepspeed
    with stop_signals_end_the_process():  # the process group's rendezvous waits in C++ for every rank
        if deepspeed and not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            # accelerate finds no backend without CUDA and counts 1 process while DeepSpeed's own
            # init_distributed (gloo on its CPU accelerator) joins all of them: name gloo so both agree
            return cpu, PartialState(cpu=False, backend="gloo")
        return cpu, PartialState(cpu=cpu)


@contextlib.contextmanager
def stop_signals_end_the_process():
    """Inside, SIGTERM/SIGHUP/SIGUSR1 have their default action: the process ends at once. A Python handler (the
    CLI's "nothing to save" before training) runs only between bytecodes, never while the main thread waits in
    C++ (a rendezvous for a rank that never comes: the process ignored SIGTERM and Ctrl-C until SIGKILL)."""
    sigs = [s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None), getattr(signal, "SIGUSR1", None)) if s]
    try:
        before = {s: signal.signal(s, signal.SIG_DFL) for s in sigs}
    except ValueError:  # not the main thread: signals are not ours to change
        yield
        return
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
