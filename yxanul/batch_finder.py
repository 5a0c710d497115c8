"""Batch plan: micro-batch × gradient accumulation × world size toward a target effective batch,
and an adaptive finder for the largest micro-batch that fits (`yxanul find-batch`).

Why not accelerate's ``find_executable_batch_size`` / HF ``auto_find_batch_size``: they shrink the
batch by 10 % on OOM and leave gradient accumulation alone, so the effective batch silently changes.
Here the micro-batch is searched (exponential, then binary), and accumulation is derived so that
micro × accumulation × world is exactly the target (or the closest, with a one-line warning).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Callable

from .errors import ConfigError


@dataclass
class BatchArgs:
    """Micro-batch, accumulation and the effective batch."""

    micro_batch_size: int = field(default=8, metadata={"help": "Sequences per forward/backward on each process."})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "Micro-batches per optimizer step (ignored when a target is set)."})
    auto_batch_size: bool = field(default=False, metadata={"help": "Probe the largest micro-batch that fits (GPU), then derive accumulation."})
    target_effective_batch_size: int | None = field(
        default=None, metadata={"help": "Sequences per optimizer step across all processes (sets accumulation)."})
    target_tokens_per_step: int | None = field(
        default=None, metadata={"help": "Tokens per optimizer step across all processes (sets accumulation)."})
    max_micro_batch_size: int = field(default=256, metadata={"help": "Upper bound of the micro-batch search."})
    batch_safety_margin: float = field(default=0.9, metadata={"help": "Use this fraction of the largest micro-batch that fit."})
    curriculum: list[dict] | None = field(
        default=None, metadata={"help": "YAML only: sequence-length stages [{seq_length, until_tokens | until_steps}]."})

    def __post_init__(self):
        for key in ("micro_batch_size", "gradient_accumulation_steps", "max_micro_batch_size"):
            if getattr(self, key) < 1:
                raise ConfigError(key, "an integer >= 1", getattr(self, key))
        if self.target_effective_batch_size is not None and self.target_tokens_per_step is not None:
            raise ConfigError("target_tokens_per_step", "unset when target_effective_batch_size is set", self.target_tokens_per_step)
        for key in ("target_effective_batch_size", "target_tokens_per_step"):
            v = getattr(self, key)
            if v is not None and v < 1:
                raise ConfigError(key, "a positive integer or null", v)
        if not 0.1 <= self.batch_safety_margin <= 1.0:
            raise ConfigError("batch_safety_margin", "a number in [0.1, 1]", self.batch_safety_margin)


@dataclass
class BatchPlan:
    micro_batch: int
    grad_accum: int
    world_size: int
    seq_length: int
    target: int | None = None      # sequences per step asked for
    warning: str | None = None

    @property
    def effective_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.world_size

    @property
    def tokens_per_step(self) -> int:
        return self.effective_batch * self.seq_length


def plan_batch(max_micro: int, world_size: int, seq_length: int, target_effective_batch_size: int | None = None,
               target_tokens_per_step: int | None = None, multiple: int = 1) -> BatchPlan:
    """Largest micro ≤ ``max_micro`` (a multiple of ``multiple``) with micro × accum × world == target;
    if none divides the target, the closest product, with a warning stating the deviation."""
    target = target_effective_batch_size
    if target_tokens_per_step is not None:
        target = max(1, round(target_tokens_per_step / seq_length))
    if target is None:
        return BatchPlan(max_micro, 1, world_size, seq_length)
    per_rank = max(1, target // world_size) if target >= world_size else 1
    best = None
    for micro in range(min(max_micro, max(per_rank, 1)), 0, -1):
        if micro % multiple and micro != 1:
            continue
        accum = max(1, round(target / (micro * world_size)))
        err = abs(micro * accum * world_size - target)
        key = (err, -micro)
        if best is None or key < best[0]:
            best = (key, micro, accum)
        if err == 0:
            break
    _, micro, accum = best
    plan = BatchPlan(micro, accum, world_size, seq_length, target)
    if plan.effective_batch != target:
        dev = (plan.effective_batch - target) / target
        plan.warning = (f"effective batch {plan.effective_batch} sequences instead of {target} ({dev:+.1%}): "
                        f"no micro-batch <= {max_micro} x {world_size} processes divides it")
    return plan


def default_is_oom(e: BaseException) -> bool:
    from accelerate.utils.memory import should_reduce_batch_size

    return should_reduce_batch_size(e)


@dataclass
class SearchResult:
    micro_batch: int
    largest_ok: int
    smallest_fail: int | None
    probes: list[tuple[int, bool, float]] = field(default_factory=list)


def find_micro_batch(probe: Callable[[int], None], *, max_size: int, start: int = 1, multiple: int = 1,
                     safety_margin: float = 0.9, is_oom: Callable[[BaseException], bool] = default_is_oom,
                     reduce_min: Callable[[int], int] | None = None) -> SearchResult:
    """Exponential growth from ``start`` until a probe OOMs (or ``max_size``), then binary search:
    about 2·log2(max_size) probes. Non-OOM errors propagate. ``reduce_min`` makes ranks agree."""
    probes: list[tuple[int, bool, float]] = []

    def ok(b: int) -> bool:
        t = time.perf_counter()
        try:
            probe(b)
            good = True
        except Exception as e:  # noqa: BLE001 - filtered right below
            if not is_oom(e):
                raise
            good = False
        finally:
            gc.collect()
            try:
                import torch

                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            except Exception:
                pass
        if reduce_min is not None:
            good = bool(reduce_min(int(good)))
        probes.append((b, good, time.perf_counter() - t))
        return good

    def snap(b: int) -> int:
        return max(multiple, (b // multiple) * multiple)

    lo, hi = 0, None
    b = snap(max(start, 1))
    while b <= max_size:
        if ok(b):
            lo = b
            if b == max_size:
                break
            b = min(max_size, snap(b * 2))
        else:
            hi = b
            break
    if lo == 0:
        raise RuntimeError(f"even a micro-batch of {b} does not fit (out of memory)")
    while hi is not None and hi - lo > multiple:
        mid = snap((lo + hi) // 2)
        if mid <= lo:
            break
        if ok(mid):
            lo = mid
        else:
            hi = mid
    # the margin guards against fragmentation near an OOM boundary; none was hit when lo == max_size
    chosen = snap(int(lo * safety_margin)) if hi is not None and lo > multiple else lo
    return SearchResult(min(chosen, lo), lo, hi, probes)


def resolve_batch(args: BatchArgs, *, model=None, plan=None, seq_length: int, world_size: int, run_dir=None,
                  say=print) -> BatchPlan:
    """The trainer's batch plan: fixed micro/accum, or derived from a target (after a search when
    ``auto_batch_size``). Prints the warning when the target can't be met exactly."""
    if not (args.target_effective_batch_size or args.target_tokens_per_step):
        if args.auto_batch_size:
            say("auto_batch_size: no target_effective_batch_size/target_tokens_per_step set; "
                "keeping gradient_accumulation_steps as given")
        micro = args.micro_batch_size
        if args.auto_batch_size and model is not None:
            micro = _search_for(args, model, plan, seq_length, say, world_size, run_dir)
        return BatchPlan(micro, args.gradient_accumulation_steps, world_size, seq_length)
    micro = args.micro_batch_size
    if args.auto_batch_size and model is not None:
        micro = _search_for(args, model, plan, seq_length, say, world_size, run_dir)
    bp = plan_batch(micro, world_size, seq_length, args.target_effective_batch_size, args.target_tokens_per_step)
    if bp.warning:
        say(f"warning: {bp.warning}")
    return bp


def _search_for(args: BatchArgs, model, plan, seq_length: int, say, world_size: int = 1, run_dir=None) -> int:
    import torch

    if not torch.cuda.is_available():
        say(f"auto_batch_size: no CUDA device, nothing can run out of memory; using micro_batch_size={args.micro_batch_size}")
        return args.micro_batch_size
    probe = make_training_probe(model, seq_length, plan)
    found = []

    def search() -> SearchResult:
        res = find_micro_batch(probe, max_size=args.max_micro_batch_size, safety_margin=args.batch_safety_margin)
        found.append(res)
        return res

    key = cache_key(model, seq_length, plan.label if plan is not None else "?", world_size)
    micro, hit = cached_search(key, run_dir, search)
    if hit:
        say(f"auto_batch_size: micro-batch {micro} from the cache (key {key}); delete batch_cache.json to re-probe")
    else:
        res = found[0]
        say(f"auto_batch_size: largest micro-batch that fit {res.largest_ok}, using {micro} "
            f"({len(res.probes)} probes, {sum(p[2] for p in res.probes):.1f}s)")
    return micro


def make_training_probe(model, seq_length: int, plan=None, steps: int = 2) -> Callable[[int], None]:
    """A probe running REAL training steps (forward, backward, AdamW step) at micro-batch b on the
    model's device with random tokens, under the run's precision context. The model's weights are
    restored afterwards; optimizer state is allocated so its memory counts."""
    import contextlib

    import torch

    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")

    def probe(b: int) -> None:
        saved = {k: v.detach().clone().cpu() for k, v in model.state_dict().items()}
        model.to(device)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.0)
        ctx = (lambda: plan.forward_context(training=True)) if plan is not None else contextlib.nullcontext
        try:
            for _ in range(steps):
                x = torch.randint(0, model.config.vocab_size, (b, seq_length), device=device)
                with ctx():
                    loss = model(x, shift_labels=x).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
        finally:
            del opt
            model.zero_grad(set_to_none=True)
            model.load_state_dict(saved)

    return probe


# ---------------------------------------------------------------------------- cache
def cache_key(model, seq_length: int, precision: str, world_size: int) -> str:
    import hashlib
    import json

    import torch

    c = model.config
    shape = {k: getattr(c, k) for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                        "num_key_value_heads", "intermediate_size", "backend")}
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    blob = json.dumps({"shape": shape, "seq": seq_length, "precision": precision, "gpu": gpu, "world": world_size,
                       "ckpt": bool(getattr(model, "is_gradient_checkpointing", False)), "optim": "adamw"},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _cache_files(run_dir) -> list:
    import os
    from pathlib import Path

    files = [Path(os.environ.get("YXANUL_CACHE", Path.home() / ".cache" / "yxanul")) / "batch_cache.json"]
    if run_dir is not None:
        files.insert(0, Path(run_dir) / "batch_cache.json")
    return files


def cached_search(key: str, run_dir, search: Callable[[], SearchResult]) -> tuple[int, bool]:
    """Micro-batch for ``key`` from the run's or the user's cache, else ``search()`` and store it."""
    import json

    for f in _cache_files(run_dir):
        try:
            hit = json.loads(f.read_text()).get(key)
        except (OSError, ValueError):
            continue
        if hit:
            return int(hit["micro_batch"]), True
    res = search()
    for f in _cache_files(run_dir):
        try:
            f.parent.mkdir(parents=True, exist_ok=True)
            data = json.loads(f.read_text()) if f.is_file() else {}
            data[key] = {"micro_batch": res.micro_batch, "largest_ok": res.largest_ok, "probes": len(res.probes)}
            f.write_text(json.dumps(data, indent=2))
        except (OSError, ValueError):
            pass
    return res.micro_batch, False


# ---------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    """`yxanul find-batch [--config FILE] [training flags] [--world_size N]`."""
    import argparse
    import os

    import torch

    from .config import parse_args
    from .models.args import build_model
    from .precision import resolve_precision

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--world_size", type=int, default=int(os.environ.get("WORLD_SIZE", 1)))
    pre.add_argument("--vocab_size", type=int, default=50257, help="tokenizer size (default: GPT-2's)")
    ours, rest = pre.parse_known_args(argv)
    cfg = parse_args(rest, prog="yxanul find-batch")
    t0 = time.perf_counter()
    model = build_model(cfg.model, vocab_size=ours.vocab_size)
    plan = resolve_precision(cfg.precision, model.config)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        print(f"CPU: nothing runs out of memory here, so the search stops at max_micro_batch_size="
              f"{cfg.batch.max_micro_batch_size}; run it on the GPU you will train on.")
    probe = make_training_probe(model, cfg.model.seq_length, plan)
    peaks: dict[int, float] = {}

    def measured(b: int) -> None:
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        try:
            probe(b)
        finally:
            if device == "cuda":
                peaks[b] = torch.cuda.max_memory_allocated() / 2**30

    res = find_micro_batch(measured, max_size=cfg.batch.max_micro_batch_size, safety_margin=cfg.batch.batch_safety_margin)
    print(f"{'micro':>6}  {'result':<6}  {'seconds':>8}  {'peak GiB':>8}")
    for b, ok, sec in res.probes:
        print(f"{b:>6}  {'ok' if ok else 'OOM':<6}  {sec:>8.2f}  {peaks.get(b, float('nan')):>8.2f}")
    bp = plan_batch(res.micro_batch, ours.world_size, cfg.model.seq_length, cfg.batch.target_effective_batch_size,
                    cfg.batch.target_tokens_per_step)
    if bp.warning:
        print(f"warning: {bp.warning}")
    if not (cfg.batch.target_effective_batch_size or cfg.batch.target_tokens_per_step):
        bp = BatchPlan(res.micro_batch, cfg.batch.gradient_accumulation_steps, ours.world_size, cfg.model.seq_length)
    print(f"largest micro-batch that fit: {res.largest_ok}; with safety margin {cfg.batch.batch_safety_margin}: "
          f"{res.micro_batch} ({len(res.probes)} probes)")
    print(f"plan: micro {bp.micro_batch} x accumulation {bp.grad_accum} x world {bp.world_size} = "
          f"{bp.effective_batch} sequences = {bp.tokens_per_step:,} tokens per optimizer step "
          f"[{plan.label}, {device}] in {time.perf_counter() - t0:.1f}s")
    return 0
