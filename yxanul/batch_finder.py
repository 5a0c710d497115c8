"""`yxanul find-batch` and the trainer's batch plan: the largest micro-batch that fits (searched with
real training steps, cached), then accumulation so that micro x accumulation x world is exactly the
target effective batch (or the closest, with a one-line warning).

Why not accelerate's ``find_executable_batch_size`` / HF ``auto_find_batch_size``: they shrink the
batch by 10 % per OOM and leave accumulation alone, so the effective batch silently changes.
The pieces live in :mod:`yxanul.batching`; docs/batching.md has the details.
"""

from __future__ import annotations

import time

from .batching import (FP8_TOKEN_ALIGN, BatchArgs, BatchPlan, NoFitError, SearchResult, TrainingProbe, apply_margin,
                       cache_fields, cache_files, cache_key, default_is_oom, find_micro_batch, fp8_micro_multiple,
                       free_memory, get_or_find, make_training_probe, micro_multiple, plan_batch, probe_context,
                       torch_reduce_min, user_cache_file)
from .batching.cache import store
from .batching.probe import _checkpointing_on
from .errors import ConfigError

__all__ = ["FP8_TOKEN_ALIGN", "BatchArgs", "BatchPlan", "NoFitError", "SearchResult", "TrainingProbe", "apply_margin",
           "cache_fields", "cache_files", "cache_key", "default_is_oom", "find_micro", "find_micro_batch",
           "fp8_micro_multiple", "free_memory", "get_or_find", "main", "make_training_probe", "micro_multiple",
           "plan_batch", "precision_label", "probe_context", "resolve_batch", "torch_reduce_min", "user_cache_file"]


def precision_label(plan) -> str:
    """Stable precision name for the cache key (a plan's ``label`` changes once TE reports back)."""
    if plan is None:
        return "fp32"
    if plan.fp8_enabled:
        return f"fp8-{plan.args.fp8_recipe}-{plan.args.fp8_format}"
    return plan.base


def _oom_signal(device) -> bool:
    """Whether running out of memory raises on ``device`` (CUDA); a CPU just swaps."""
    return device.type == "cuda"


def find_micro(args: BatchArgs, *, model, plan=None, seq_length: int, world_size: int = 1, run_dir=None, say=print,
               device=None, reduce_min=None, write_cache: bool = True, on_probe=None) -> tuple[int, SearchResult | None]:
    """``(micro, result)``: with ``auto_batch_size`` on CUDA, the largest micro-batch that fits (safety
    margin applied), from the cache or a search with real training steps on ``model``; otherwise (or
    on CPU, where nothing signals OOM) ``args.micro_batch_size`` and None, silently."""
    import torch

    if not args.auto_batch_size:
        return args.micro_batch_size, None
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if not _oom_signal(device):  # the caller says what it uses instead
        return args.micro_batch_size, None
    fp8 = bool(plan is not None and plan.fp8_enabled)
    multiple = micro_multiple(args, seq_length, plan.token_alignment if fp8 else 1)
    ckpt = _checkpointing_on(model)
    fields = cache_fields(model.config, seq_length=seq_length, precision=precision_label(plan), world_size=world_size,
                          gradient_checkpointing=ckpt, multiple=multiple, device=device)
    probe = make_training_probe(model, seq_length=seq_length, forward_context=probe_context(plan, device),
                                device=device, forward_kwargs={"is_first_microbatch": True} if fp8 else None)

    def live(b, ok, sec):
        peak = probe.peak_bytes.get(b)
        say(f"auto_batch_size: micro-batch {b:>5} {'ok ' if ok else 'OOM'} {sec:6.1f}s"
            + (f"  peak {peak / 2**30:.1f} GiB" if peak is not None else ""))
        if on_probe is not None:
            on_probe(b, ok, sec)

    def search() -> SearchResult:
        say(f"auto_batch_size: probing micro-batches up to {args.max_micro_batch_size} (multiples of {multiple}) "
            f"at seq_length {seq_length} with real training steps")
        return find_micro_batch(probe, max_size=args.max_micro_batch_size, multiple=multiple,
                                safety_margin=args.batch_safety_margin, on_probe=live, reduce_min=reduce_min)

    res, hit = get_or_find(fields, search, max_size=args.max_micro_batch_size, safety_margin=args.batch_safety_margin,
                           multiple=multiple, run_dir=run_dir, write=write_cache, reduce_min=reduce_min,
                           extra=lambda r: {"peak_bytes": {str(k): v for k, v in probe.peak_bytes.items()}})
    where = f"from the cache (key {cache_key(fields)}; delete it in batch_cache.json to re-probe)" if hit else \
        f"after {len(res.probes)} probes in {res.seconds:.1f}s"
    say(f"auto_batch_size: largest micro-batch that fit {res.largest_ok}"
        + (" (cap, no OOM)" if res.smallest_fail is None else f", OOM at {res.smallest_fail}")
        + f"; using {res.micro_batch} {where}")
    return res.micro_batch, res


def resolve_batch(args: BatchArgs, *, model=None, plan=None, seq_length: int, world_size: int, run_dir=None,
                  say=print, device=None, reduce_min=None, write_cache: bool = True) -> BatchPlan:
    """The trainer's batch plan: the micro-batch (given, or found with ``auto_batch_size``), then
    accumulation from ``target_effective_batch_size`` / ``target_tokens_per_step`` (else
    ``gradient_accumulation_steps``). Prints the warning/note lines. In a distributed run pass
    ``reduce_min=torch_reduce_min()`` and ``write_cache=accelerator.is_main_process`` on every rank."""
    fp8 = bool(plan is not None and plan.fp8_enabled)
    multiple = micro_multiple(args, seq_length, plan.token_alignment if fp8 else 1)
    if args.auto_batch_size and not args.target:
        say("auto_batch_size: no target_effective_batch_size/target_tokens_per_step set; the effective batch "
            "will follow the micro-batch found (gradient_accumulation_steps as given)")
    micro = args.micro_batch_size
    if args.auto_batch_size and model is not None:
        micro, found = find_micro(args, model=model, plan=plan, seq_length=seq_length, world_size=world_size,
                                  run_dir=run_dir, say=say, device=device, reduce_min=reduce_min,
                                  write_cache=write_cache)
        if found is None:
            say(f"auto_batch_size: no CUDA device, nothing signals out-of-memory here; using micro_batch_size={micro}")
    if micro % multiple:
        why = (f" (FP8: micro-batch x seq_length must be a multiple of {plan.token_alignment})"
               if fp8 and multiple > 1 else "")
        raise ConfigError("micro_batch_size", f"a multiple of {multiple}{why}", micro)
    bp = plan_batch(micro, world_size, seq_length, args.target_effective_batch_size, args.target_tokens_per_step,
                    multiple=multiple, grad_accum=args.gradient_accumulation_steps)
    for line in (bp.warning, bp.note):
        if line:
            say(f"warning: {line}")
    return bp


# ---------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    """`yxanul find-batch --model PRESET --seq_length N [any training flag] [--config FILE] [--world_size N]`."""
    import argparse
    import os

    import torch

    from .config import parse_args
    from .models.args import build_model
    from .precision import resolve_precision

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--world_size", type=int, default=int(os.environ.get("WORLD_SIZE", 1)),
                     help="processes the plan is for (the probe runs on this one GPU)")
    pre.add_argument("--vocab_size", type=int, default=50257, help="tokenizer size (default: GPT-2's 50257)")
    pre.add_argument("--no_cache", action="store_true", help="don't record the result in the user cache")
    ours, rest = pre.parse_known_args(argv)
    if {"-h", "--help"} & set(rest):
        print(main.__doc__ + "\n\nfind-batch's own flags:")
        pre.print_help()
        print("\nEvery `yxanul train` flag is accepted as well (`yxanul train --help`).")
        return 0
    cfg = parse_args(rest, prog="yxanul find-batch")
    if ours.world_size < 1:
        raise ConfigError("world_size", "an integer >= 1", ours.world_size)
    t0 = time.perf_counter()
    model = build_model(cfg.model, vocab_size=ours.vocab_size)
    plan = resolve_precision(cfg.precision, model.config)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    b = cfg.batch
    T = cfg.model.seq_length
    multiple = micro_multiple(b, T, plan.token_alignment)
    if device.type == "cpu":
        print(f"CPU: no out-of-memory signal here, so the search grows to max_micro_batch_size={b.max_micro_batch_size} "
              "and uses that cap; run find-batch on the GPU you will train on.")
    probe = make_training_probe(model, seq_length=T, forward_context=probe_context(plan, device), device=device,
                                forward_kwargs={"is_first_microbatch": True} if plan.fp8_enabled else None)
    print(f"probing {cfg.model.model} ({model.config.backend}, {precision_label(plan)}, seq_length {T}, "
          f"checkpointing {cfg.model.gradient_checkpointing}) up to {b.max_micro_batch_size} on {device}")
    print(f"{'micro':>6}  {'result':<6}  {'seconds':>8}  {'peak GiB':>8}")

    def row(size, ok, sec):
        peak = probe.peak_bytes.get(size)
        print(f"{size:>6}  {'ok' if ok else 'OOM':<6}  {sec:>8.2f}  "
              f"{'-' if peak is None else f'{peak / 2**30:.2f}':>8}", flush=True)

    res = find_micro_batch(probe, max_size=b.max_micro_batch_size, multiple=multiple,
                           safety_margin=b.batch_safety_margin, on_probe=row)
    if device.type == "cuda" and not ours.no_cache:
        fields = cache_fields(model.config, seq_length=T, precision=precision_label(plan), world_size=ours.world_size,
                              gradient_checkpointing=cfg.model.gradient_checkpointing, multiple=multiple, device=device)
        store(cache_key(fields), fields, res, cache_files(None), {"peak_bytes": {str(k): v for k, v in probe.peak_bytes.items()}})
        print(f"recorded in {user_cache_file()}")
    bound = f"OOM at {res.smallest_fail}, safety margin {b.batch_safety_margin}" if res.smallest_fail else \
        "the cap, no OOM: no margin"
    print(f"largest micro-batch that fit: {res.largest_ok} ({bound}) -> micro-batch {res.micro_batch}; "
          f"{len(res.probes)} probes, {res.seconds:.1f}s")
    bp = plan_batch(res.micro_batch, ours.world_size, T, b.target_effective_batch_size, b.target_tokens_per_step,
                    multiple=multiple, grad_accum=b.gradient_accumulation_steps)
    for line in (bp.warning, bp.note):
        if line:
            print(f"warning: {line}")
    print(f"plan: {bp.line()} [{precision_label(plan)}, {device}]")
    print(f"total {time.perf_counter() - t0:.1f}s")
    return 0
