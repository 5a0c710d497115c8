"""The trainer's batch plan: the largest micro-batch that fits (searched with
real training steps, cached), then accumulation so that micro x accumulation x world is exactly the
target effective batch (or the closest, with a one-line warning); per curriculum stage too.

Why not accelerate's ``find_executable_batch_size`` / HF ``auto_find_batch_size``: they shrink the
batch by 10 % per OOM and leave accumulation alone, so the effective batch silently changes.
docs/batching.md has the details.
"""

from __future__ import annotations

import os

from ...errors import ConfigError, UserError
from ..schedule import Curriculum, same_tokens_micro
from .args import BatchArgs, micro_multiple
from .cache import cache_fields, cache_key, get_or_find
from .plan import BatchPlan, plan_batch
from .probe import TrainingProbe, checkpointing_on
from .search import SearchResult, find_micro_batch


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
               device=None, reduce_min=None, write_cache: bool = True,
               on_probe=None) -> tuple[int, SearchResult | None]:
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
    ckpt = checkpointing_on(model)
    fields = cache_fields(model.config, seq_length=seq_length, precision=precision_label(plan), world_size=world_size,
                          gradient_checkpointing=ckpt, multiple=multiple, device=device)
    probe = TrainingProbe(model, seq_length=seq_length, plan=plan, device=device)

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


NO_TARGET = ("no target_effective_batch_size/target_tokens_per_step set; the effective batch will follow the "
             "micro-batch found (gradient_accumulation_steps as given)")


def resolve_batch(args: BatchArgs, *, model=None, plan=None, seq_length: int, world_size: int, run_dir=None,
                  say=print, device=None, reduce_min=None, write_cache: bool = True) -> BatchPlan:
    """The trainer's batch plan: the micro-batch (given, or found with ``auto_batch_size``), then
    accumulation from ``target_effective_batch_size`` / ``target_tokens_per_step`` (else
    ``gradient_accumulation_steps``). Prints the warning/note lines. In a distributed run pass
    ``reduce_min=torch_reduce_min()`` and ``write_cache=accelerator.is_main_process`` on every rank."""
    fp8 = bool(plan is not None and plan.fp8_enabled)
    multiple = micro_multiple(args, seq_length, plan.token_alignment if fp8 else 1)
    if args.auto_batch_size and not args.target:
        say(f"auto_batch_size: {NO_TARGET}")
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


def plan_curriculum(cfg, batch: BatchPlan, tokens_per_step: int, world_size: int, say, *, model=None, plan=None,
                    run_dir=None, reduce_min=None, write_cache: bool = True):
    """``(curriculum, plans)``: the stages and one batch plan per stage at the same tokens per optimizer
    step (None, None without a curriculum). With ``auto_batch_size`` each stage's micro-batch is
    searched (and cached) at its own seq_length; otherwise (or on CPU) it keeps the base plan's tokens
    per micro-batch."""
    if not cfg.batch.curriculum:
        return None, None

    cur = Curriculum.from_config(cfg.batch.curriculum, tokens_per_step, max_seq_length=cfg.model.seq_length)
    for line in [*cur.grid_warnings(cfg.model.seq_length), *cur.reach_warnings(cfg.train.max_steps)]:
        say(line)
    same_tokens = same_tokens_micro(batch.micro_batch, cfg.model.seq_length)
    align = plan.token_alignment if plan is not None else 1

    def micro_for(seq_length: int) -> int:
        if cfg.batch.auto_batch_size and model is not None:
            micro, found = find_micro(cfg.batch, model=model, plan=plan, seq_length=seq_length, world_size=world_size,
                                      run_dir=run_dir, say=say, reduce_min=reduce_min, write_cache=write_cache)
            if found is not None:
                return micro
        return same_tokens(seq_length)

    plans = cur.plan_stages(micro_for, world_size, multiple=lambda T: micro_multiple(cfg.batch, T, align))
    for i, bp in enumerate(plans):
        if bp.warning:
            say(f"warning: curriculum stage {i}: {bp.warning}")
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" and len({p.grad_accum for p in plans}) > 1:
        raise UserError("curriculum: stages need different gradient accumulation, which DeepSpeed fixes at start; "
                        "choose micro_batch_size/target_tokens_per_step so accumulation is the same in every stage")
    return cur, plans


# ---------------------------------------------------------------------------- CLI
