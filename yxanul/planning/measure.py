"""Measured peak memory of real training steps, to check the planner against (tests, docs).

``python -m yxanul.planning.measure CASES.json [cpu|cuda]`` runs each case ``{"fields": {YxanulConfig
fields}, "micro": B, "seq_length": T, "checkpointing": bool}`` (optional: ``"backend": "te"`` with ``"fp8":
bool`` -- TE's delayed scaling on every layer --, ``"loss_impl"``) in this fresh process: the model, the
project's optimizer and ``train_step`` with BF16 autocast (what accelerate applies), two optimizer
steps of two accumulated micro-batches (the second step is the steady state: Adam states exist,
gradients live through the second micro-batch). It prints one JSON line per case with the peak: on
CUDA ``torch.cuda.max_memory_allocated`` minus what was allocated before the model; on the CPU the
peak resident set size (VmHWM, reset through ``/proc/self/clear_refs`` before each case) minus the
resident size before the model. Under ``torchrun`` (WORLD_SIZE > 1, gloo) every rank prints its own
line; the third argument picks the wrapping: ``ddp`` (DistributedDataParallel with its default
arguments, as accelerate's ``prepare`` does) or ``fsdp2`` (``fully_shard`` per decoder layer and at
the root, bf16 parameters in compute and fp32 gradient reduction, no autocast). Run it with
``MALLOC_MMAP_THRESHOLD_=65536``: glibc then returns every freed tensor to the system, so the
resident size follows what is allocated (the default threshold adapts upward and keeps freed memory resident).
"""

from __future__ import annotations

import gc
import json
import os
import resource
import sys

from ..models import YxanulConfig, YxanulForCausalLM
from ..precision import resolve_precision
from ..precision.args import PrecisionArgs
from ..training.optim import OptimArgs, build_optimizer
from ..training.step import train_step


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets the peak RSS (VmHWM) to the current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def wrap(model, strategy: str, fp8: bool = False):
    """``(model to step, precision plan)`` for ``strategy`` (single, ddp, fsdp2); ``fp8``: TE's delayed scaling
    on every layer (one process)."""
    import torch

    if fp8 or model.config.backend == "te":  # the plan as the trainer prepares it: TE's recipe, read-back
        if strategy != "single":
            raise ValueError(f"measure: TE cases run in one process (strategy single), not {strategy}")
        args = (PrecisionArgs(use_fp8=True, require_fp8=True, fp8_min_gemm_dim=0) if fp8
                else PrecisionArgs(mixed_precision="bf16"))
        plan = resolve_precision(args, model.config)
        plan.prepare_model(model)
        return model, plan
    bf16 = resolve_precision(PrecisionArgs(mixed_precision="bf16"), model.config)  # autocast, as accelerate
    if strategy == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model), bf16
    if strategy == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=mp)
        return fully_shard(model, mp_policy=mp), None
    return model, bf16


def measure(fields: dict, micro: int, seq_length: int, checkpointing: bool = False, device: str = "cpu",
            strategy: str = "single", backend: str = "torch", fp8: bool = False, loss_impl: str = "default") -> dict:
    """Peak bytes above the baseline of two accumulated micro-batches x two optimizer steps."""
    import torch

    config = YxanulConfig(**fields, max_position_embeddings=seq_length, backend=backend, loss_impl=loss_impl)
    batches = [torch.randint(0, config.vocab_size, (micro, seq_length + 1), device=device) for _ in range(2)]
    cuda = torch.device(device).type == "cuda"
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = rss_bytes()
        reset_peak_rss()
    with torch.device(device):  # TE allocates at construction
        model = YxanulForCausalLM(config)
    if checkpointing:
        model.set_activation_checkpointing(True)
    wrapped, plan = wrap(model, strategy, fp8)
    opt = build_optimizer(model, OptimArgs())  # after fully_shard: the optimizer steps the local shards
    for _ in range(2):
        train_step(wrapped, opt, batches, plan=plan, max_grad_norm=1.0, device=device)
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = peak_rss_bytes() - base
    del model, wrapped, opt
    return {"peak_bytes": peak, "baseline_bytes": base, "device": device,
            "world_size": int(os.environ.get("WORLD_SIZE", "1"))}


if __name__ == "__main__":
    cases = json.loads(open(sys.argv[1]).read())
    dev = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    how = sys.argv[3] if len(sys.argv) > 3 else "single"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    for case in cases:
        print(json.dumps(measure(case["fields"], case["micro"], case["seq_length"], case.get("checkpointing", False),
                                 device=dev, strategy=how, backend=case.get("backend", "torch"),
                                 fp8=case.get("fp8", False), loss_impl=case.get("loss_impl", "default"))),
              flush=True)
