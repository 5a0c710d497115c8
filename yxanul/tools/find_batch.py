"""`yxanul find-batch`: the largest micro-batch that fits, searched with real training steps of the run
`yxanul train` would resolve (its flags and --config), cached, then the batch plan it gives. On a CPU,
where nothing raises out-of-memory, the search is bounded by the run's own batch and half the memory
available (``MemoryBudget``). The search itself and the trainer's use of it: yxanul/training/batching/."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from ..config import parse_args
from ..config_file import with_default_config
from ..data.tokenizer_load import run_vocab_size
from ..errors import ConfigError
from ..flags import build_parser, parse_command_and_rest
from ..training import speed_defaults
from ..training.batching.args import BatchArgs, micro_multiple
from ..training.batching.cache import cache_fields, cache_files, cache_key, store, user_cache_file
from ..training.batching.finder import NO_TARGET, precision_label
from ..training.batching.plan import plan_batch
from ..training.batching.probe import TrainingProbe
from ..training.batching.search import SearchResult, default_is_oom, find_micro_batch


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
    prog = "yxanul find-batch"
    own, rest = parse_command_and_rest(FindBatchCommand, argv, prog)
    return own, parse_args(with_default_config(rest), prog=prog)


def _print_help() -> None:
    print(main.__doc__.splitlines()[0] + "\n")  # the usage line; the rest of the docstring is for callers
    build_parser(FindBatchCommand, "yxanul find-batch").print_help()
    print("\nEvery `yxanul train` flag is accepted as well (`yxanul train --help`).")


def main(argv: list[str] | None = None, speed_table: dict | None = None) -> int:
    """`yxanul find-batch --model PRESET --seq_length N [any training flag] [--config FILE] [--world_size N]`.
    ``speed_table``: the speed defaults (None: the shipped table), applied as the run would get them."""
    if {"-h", "--help"} & set(argv or []):
        _print_help()
        return 0
    import torch  # torch only past --help and flag errors (both stay under a second)

    from ..models.build import build_model, model_config  # torch: --help stays light
    from ..precision import probe_facts, resolve_precision  # torch: --help stays light

    ours, cfg = _parse(argv)
    t0 = time.perf_counter()
    vocab = ours.vocab_size or run_vocab_size(cfg.to_flat_dict())  # as train and plan size it: one home
    # the probe measures the run's loss and weights; cuda_graphs held off: the probes change the micro-batch
    cfg, line = speed_defaults.for_run(cfg, model_config(cfg.model, vocab).backend, speed_table, probes=True,
                                       facts=probe_facts())
    if line:
        print(line)
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
    if not b.target and res.micro_batch != b.micro_batch_size:
        given = b.micro_batch_size * b.gradient_accumulation_steps * world_size
        print(f"warning: {NO_TARGET}: {given} sequences a step as configured, {bp.effective_batch} with micro-batch "
              f"{res.micro_batch} (set target_effective_batch_size {given} to keep it)")
    for line in (bp.warning, bp.note):
        if line:
            print(f"warning: {line}")
    print(f"plan: {bp.line()} [{precision_label(plan)}, {device}]")
