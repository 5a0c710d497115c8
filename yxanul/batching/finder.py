"""The trainer's batch plan and `yxanul find-batch`: the largest micro-batch that fits (searched with
real training steps, cached), then accumulation so that micro x accumulation x world is exactly the
target effective batch (or the closest, with a one-line warning); per curriculum stage too.

Why not accelerate's ``find_executable_batch_size`` / HF ``auto_find_batch_size``: they shrink the
batch by 10 % per OOM and leave accumulation alone, so the effective batch silently changes.
docs/batching.md has the details.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from ..errors import ConfigError, UserError
from .args import BatchArgs, micro_multiple
from .cache import cache_fields, cache_files, cache_key, get_or_find, store, user_cache_file
from .plan import BatchPlan, plan_batch
from .probe import TrainingProbe, checkpointing_on
from .search import SearchResult, default_is_oom, find_micro_batch


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


def plan_curriculum(cfg, batch: BatchPlan, tokens_per_step: int, world_size: int, say, *, model=None, plan=None,
                    run_dir=None, reduce_min=None, write_cache: bool = True):
    """``(curriculum, plans)``: the stages and one batch plan per stage at the same tokens per optimizer
    step (None, None without a curriculum). With ``auto_batch_size`` each stage's micro-batch is
    searched (and cached) at its own seq_length; otherwise (or on CPU) it keeps the base plan's tokens
    per micro-batch."""
    if not cfg.batch.curriculum:
        return None, None
    from ..training.schedule import Curriculum, same_tokens_micro

    cur = Curriculum.from_config(cfg.batch.curriculum, tokens_per_step, max_seq_length=cfg.model.seq_length)
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
@dataclass
class FindBatchCommand:
    """find-batch's own flags (every `yxanul train` flag is accepted as well)."""

    world_size: int = field(default_factory=lambda: int(os.environ.get("WORLD_SIZE", 1)),
                            metadata={"help": "Processes the plan is for (the probe runs on this one GPU)."})
    vocab_size: int | None = field(default=None, metadata={
        "help": "Tokenizer size (default: the size of the config's tokenizer, as `yxanul train` would use)."})
    no_cache: bool = field(default=False, metadata={"help": "Don't record the result in the user cache."})

    def __post_init__(self):
        if self.world_size < 1:
            raise ConfigError("world_size", "an integer >= 1", self.world_size)
        if self.vocab_size is not None and self.vocab_size < 2:
            raise ConfigError("vocab_size", "an integer >= 2", self.vocab_size)


def _parse(argv: list[str] | None):
    """find-batch's own flags with the one CLI builder, the rest as `yxanul train` flags."""
    from ..cli import with_default_config
    from ..config import parse_args
    from ..flags import parse_command_and_rest

    prog = "yxanul find-batch"
    own, rest = parse_command_and_rest(FindBatchCommand, argv, prog)
    return own, parse_args(with_default_config(rest), prog=prog)


def _print_help() -> None:
    from ..flags import build_parser

    print(main.__doc__ + "\n")
    build_parser(FindBatchCommand, "yxanul find-batch").print_help()
    print("\nEvery `yxanul train` flag is accepted as well (`yxanul train --help`).")


def main(argv: list[str] | None = None) -> int:
    """`yxanul find-batch --model PRESET --seq_length N [any training flag] [--config FILE] [--world_size N]`."""
    import torch

    from ..models.args import build_model
    from ..precision import resolve_precision

    if {"-h", "--help"} & set(argv or []):
        _print_help()
        return 0
    ours, cfg = _parse(argv)
    t0 = time.perf_counter()
    vocab = ours.vocab_size or _tokenizer_size(cfg.data.tokenizer)
    model = build_model(cfg.model, vocab_size=vocab)
    plan = resolve_precision(cfg.precision, model.config)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    b, T = cfg.batch, cfg.model.seq_length
    multiple = micro_multiple(b, T, plan.token_alignment)
    cap, budget = b.max_micro_batch_size, None
    if device.type == "cpu":
        cap, budget = cpu_bound(b, T, ours.world_size, multiple)
    probe = TrainingProbe(model, seq_length=T, plan=plan, device=device)
    print(f"probing {cfg.model.model} ({model.config.backend}, {precision_label(plan)}, vocab {vocab:,}, "
          f"seq_length {T}, checkpointing {cfg.model.gradient_checkpointing}) up to {cap} on {device}")
    print(f"{'micro':>6}  {'result':<6}  {'seconds':>8}  {'peak GiB':>8}")

    def row(size, ok, sec):
        peak = probe.peak_bytes.get(size) if budget is None else budget.used.get(size)  # CUDA peak, else RSS
        print(f"{size:>6}  {'ok' if ok else 'OOM':<6}  {sec:>8.2f}  "
              f"{'-' if peak is None else f'{peak / 2**30:.2f}':>8}", flush=True)

    res = find_micro_batch(probe if budget is None else budget.wrap(probe), max_size=cap, multiple=multiple,
                           safety_margin=b.batch_safety_margin, on_probe=row,
                           is_oom=lambda e: isinstance(e, OverBudget) or default_is_oom(e))
    if device.type == "cuda" and not ours.no_cache:
        fields = cache_fields(model.config, seq_length=T, precision=precision_label(plan), world_size=ours.world_size,
                              gradient_checkpointing=cfg.model.gradient_checkpointing, multiple=multiple, device=device)
        store(cache_key(fields), fields, res, cache_files(None),
              {"peak_bytes": {str(k): v for k, v in probe.peak_bytes.items()}})
        print(f"recorded in {user_cache_file()}")
    _print_result(res, b, ours.world_size, T, multiple, plan, device)
    print(f"total {time.perf_counter() - t0:.1f}s")
    return 0


def _tokenizer_size(name: str | None) -> int:
    from ..data.prepare import load_tokenizer

    return len(load_tokenizer(name)[1])


def cpu_bound(b: BatchArgs, seq_length: int, world_size: int, multiple: int) -> tuple[int, MemoryBudget]:
    """On a CPU nothing raises out-of-memory (the machine swaps, then the kernel kills): the search stops
    at the run's own sequences per optimizer step and process (a larger micro-batch is never used),
    and before a probe that would need more than half the memory available now."""
    per_rank = b.micro_batch_size * b.gradient_accumulation_steps
    what = "micro_batch_size x gradient_accumulation_steps"
    if b.target_tokens_per_step:
        per_rank, what = -(-b.target_tokens_per_step // (seq_length * world_size)), "target_tokens_per_step"
    elif b.target_effective_batch_size:
        per_rank, what = -(-b.target_effective_batch_size // world_size), "target_effective_batch_size"
    cap = max(multiple, min(b.max_micro_batch_size, per_rank) // multiple * multiple)
    budget = MemoryBudget()
    print(f"CPU: no out-of-memory signal here, so the search stops at {cap} (the run's {what} per process, "
          f"max_micro_batch_size {b.max_micro_batch_size}) and before a probe estimated to need more than "
          f"{budget.limit / 2**30:.1f} GiB (half the memory available now); run find-batch on the GPU you will "
          "train on for a real bound.")
    return cap, budget


class OverBudget(MemoryError):
    """A CPU probe that would need more memory than the budget: counted as "does not fit"."""


class MemoryBudget:
    """Half the memory available when created. ``wrap(probe)`` refuses a size whose memory, extrapolated
    linearly from the largest size run so far (the process's peak RSS above its RSS before the first
    probe), would pass it, and a size that pushed the peak past it."""

    def __init__(self, limit: int | None = None):
        import psutil

        self.limit = psutil.virtual_memory().available // 2 if limit is None else limit
        self.base = psutil.Process().memory_info().rss
        self.largest: tuple[int, int] | None = None  # (size, peak RSS above base)
        self.used: dict[int, int] = {}  # size -> peak RSS above base after its probe

    @staticmethod
    def _reset_peak() -> None:
        """Linux: restart the process's peak-RSS mark (VmHWM), so that a probe's peak is its own."""
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:  # elsewhere the peak is the process's (an overestimate: it only stops earlier)
            pass

    @staticmethod
    def _peak_rss() -> int:
        try:
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
        except (OSError, StopIteration, ValueError):
            import resource

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux

    def wrap(self, probe):
        def guarded(size: int) -> None:
            if self.largest is not None:
                done, used = self.largest
                if self.base + used * size / done > self.limit:
                    raise OverBudget(f"micro-batch {size}: estimated over {self.limit / 2**30:.1f} GiB")
            self._reset_peak()
            probe(size)
            used = self.used[size] = max(0, self._peak_rss() - self.base)
            if self.base + used > self.limit:
                raise OverBudget(f"micro-batch {size}: peak memory over {self.limit / 2**30:.1f} GiB")
            if self.largest is None or size > self.largest[0]:
                self.largest = (size, used)
        return guarded


def _print_result(res: SearchResult, b: BatchArgs, world_size: int, T: int, multiple: int, plan, device) -> None:
    bound = f"OOM at {res.smallest_fail}, safety margin {b.batch_safety_margin}" if res.smallest_fail else \
        "the cap, no OOM: no margin"
    print(f"largest micro-batch that fit: {res.largest_ok} ({bound}) -> micro-batch {res.micro_batch}; "
          f"{len(res.probes)} probes, {res.seconds:.1f}s")
    bp = plan_batch(res.micro_batch, world_size, T, b.target_effective_batch_size, b.target_tokens_per_step,
                    multiple=multiple, grad_accum=b.gradient_accumulation_steps)
    for line in (bp.warning, bp.note):
        if line:
            print(f"warning: {line}")
    print(f"plan: {bp.line()} [{precision_label(plan)}, {device}]")
