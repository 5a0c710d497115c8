"""`yxanul bench`: training throughput per preset x sequence length x precision on this machine.

Each case is the trainer's own step (`yxanul.training.step.train_step`)
on the real model: `build`-equivalent model (TE backend where it
imports), `resolve_precision` + `plan.prepare_model` (small-GEMM policy, read-back hooks), yxanul's
AdamW (fused on CUDA), BF16 autocast as accelerate applies it, `plan.forward_context` (te.autocast
with the configured recipe), `is_first_microbatch`, backward, clip, step. Every precision of a
(preset, seq) pair gets the same micro-batch and the same token batches (random ids, fixed seed: the
speed of a GEMM does not depend on the values). Warm-up steps are excluded; the step time is the
median of the timed steps, measured with CUDA events (no host sync inside the timed region) or
`perf_counter` on CPU. MFU is against the device's dense BF16 peak for every precision, labelled
so: an FP8 run's MFU says how much faster it trained, not how busy the FP8 units were.
"""

from __future__ import annotations

import gc
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

from ..errors import ConfigError, check_out_folder, make_out_folder
from ..flags import check_same_as, given_flags, parse_command, same_as
from ..models.args import ModelArgs
from ..models.presets import PRESETS
from ..precision.args import PrecisionArgs
from ..tracking import mfu, peak_flops
from ..training import speed_defaults
from ..training.args import TrainArgs
from ..training.batching.args import BatchArgs
from ..training.optim import OptimArgs, build_optimizer
from ..training.runtime import compile_model
from .bench_profile import profile_steps
from .bench_report import environment, markdown

PRECISIONS = ("fp32", "bf16", "fp8-delayed", "fp8-current", "fp8-block", "fp8-mxfp8")


@dataclass
class BenchCommand:
    """What to measure (comma-separated lists multiply out)."""

    presets: str = field(default="gpt2-124m,medium,xlarge", metadata={"help": "Model presets."})
    seq_lengths: str = field(default="1024,2048", metadata={"help": "Sequence lengths."})
    precisions: str = field(default="bf16,fp8-delayed,fp8-current,fp8-block,fp8-mxfp8",
                            metadata={"help": "Any of " + ", ".join(PRECISIONS) + "; an FP8 recipe that "
                                      "cannot run here is reported as skipped with TE's reason."})
    tokens_per_micro: int = field(default=16384, metadata={"help": "Micro-batch = tokens_per_micro // seq_length "
                                                           "(the same for every precision)."})
    micro_batch_size: int = field(default=0, metadata={"help": "Fixed micro-batch for every case (0: use "
                                                       "tokens_per_micro)."})
    gradient_accumulation_steps: int = same_as(BatchArgs, "gradient_accumulation_steps")
    steps: int = field(default=10, metadata={"help": "Timed optimizer steps per case (the median is reported)."})
    warmup: int = field(default=3, metadata={"help": "Untimed steps first (allocator, TE workspaces, autotune)."})
    backend: Literal["auto", "te", "torch"] = same_as(ModelArgs, "backend")
    vocab_size: int = field(default=50257, metadata={"help": "Tokenizer size (GPT-2's 50257, padded to 50304)."})
    fp8_min_gemm_dim: int = field(default=-1, metadata={"help": "Small-GEMM policy threshold for the FP8 cases "
                                                        "(-1: the training default; 0: every layer FP8)."})
    gradient_checkpointing: bool = same_as(ModelArgs, "gradient_checkpointing")
    loss_impl: Literal["default", "chunked", "te"] = same_as(ModelArgs, "loss_impl")
    fuse_qkv_params: bool = same_as(ModelArgs, "fuse_qkv_params")
    fuse_qkv_rope: bool = same_as(ModelArgs, "fuse_qkv_rope")
    rope_kernel: Literal["te", "triton"] = same_as(ModelArgs, "rope_kernel")
    norm_kernel: Literal["te", "cudnn"] = same_as(ModelArgs, "norm_kernel")
    master_weights: Literal["none", "fp32"] = same_as(PrecisionArgs, "master_weights")
    fuse_wgrad_accumulation: bool = same_as(PrecisionArgs, "fuse_wgrad_accumulation")
    fp8_attention: bool = same_as(PrecisionArgs, "fp8_attention")
    cuda_graphs: bool = same_as(ModelArgs, "cuda_graphs")
    torch_compile: bool = same_as(TrainArgs, "torch_compile")
    speed_defaults: bool = same_as(TrainArgs, "speed_defaults")
    time_limit: float = field(default=0.0, metadata={"help": "Seconds; cases not started by then are reported "
                                                     "as skipped (0: no limit)."})
    profile: bool = field(default=False, metadata={"help": "Also profile 3 steps per case: per-step wall, host and "
                                                   "device time and the top CUDA kernels, into the row and a "
                                                   "profile-*.txt in --out (where the time goes)."})
    out: str | None = field(default=None, metadata={"help": "Folder for bench.json and bench.md (checked and created "
                                                    "before the first case)."})

    def __post_init__(self):
        for key in ("tokens_per_micro", "steps", "gradient_accumulation_steps"):
            if getattr(self, key) < 1:
                raise ConfigError(key, "an integer >= 1", getattr(self, key))
        for key in ("micro_batch_size", "warmup"):
            if getattr(self, key) < 0:
                raise ConfigError(key, "an integer >= 0", getattr(self, key))
        for key, known in (("precisions", PRECISIONS), ("presets", PRESETS)):
            given = _split(getattr(self, key))
            if bad := [p for p in given if p not in known]:
                raise ConfigError(key, "a comma-separated list of " + ", ".join(known), ",".join(bad))
            if not given:  # no case to run: an empty table, exit 0, would read as a benchmark that passed
                raise ConfigError(key, "one or more of " + ", ".join(known), getattr(self, key))
        check_same_as(self)
        try:
            seqs = [int(s) for s in _split(self.seq_lengths)]
        except ValueError:
            raise ConfigError("seq_lengths", "comma-separated integers", self.seq_lengths) from None
        if not seqs or min(seqs) < 16:
            raise ConfigError("seq_lengths", "comma-separated integers >= 16", self.seq_lengths)
        self._check_ranges(max(seqs))
        if self.out is not None:  # bench.json is written after the first case: a bad folder fails now, not then
            check_out_folder("out", self.out)

    def _check_ranges(self, longest_seq: int) -> None:
        """Values that ran, but not as asked: a micro-batch of 1 at every sequence length longer than
        tokens_per_micro, -5 read as -1, and every case after the first skipped under a negative time limit."""
        if not self.micro_batch_size and self.tokens_per_micro < longest_seq:
            raise ConfigError("tokens_per_micro", f"an integer >= the longest seq_lengths ({longest_seq}): the "
                              "micro-batch is tokens_per_micro // seq_length (or set micro_batch_size)",
                              self.tokens_per_micro)
        if self.fp8_min_gemm_dim < -1:
            raise ConfigError("fp8_min_gemm_dim", "an integer >= 0, or -1 for the training default",
                              self.fp8_min_gemm_dim)
        if not self.time_limit >= 0:  # also NaN, which never compares true: no limit
            raise ConfigError("time_limit", "seconds >= 0 (0: no limit)", self.time_limit)


TE_ONLY = ("fuse_qkv_params", "fuse_qkv_rope", "fuse_wgrad_accumulation")  # the torch backend ignores or refuses
KERNEL_DEFAULTS = {"norm_kernel": "te"}  # TE-only choices with a non-boolean default


def variant(a: BenchCommand) -> str:
    """The non-default speed options of a bench call, e.g. 'loss=chunked+fused_qkv' ('' for none)."""
    parts = [f"loss={a.loss_impl}"] if a.loss_impl != "default" else []
    parts += ["fused_qkv"] * a.fuse_qkv_params + ["qkv_rope"] * a.fuse_qkv_rope + ["compile"] * a.torch_compile
    parts += [f"rope={a.rope_kernel}"] * (a.rope_kernel != "te") + [f"norm={a.norm_kernel}"] * (a.norm_kernel != "te")
    parts += [f"master={a.master_weights}"] * (a.master_weights != "none") + ["wgrad"] * a.fuse_wgrad_accumulation
    parts += ["fp8_attn"] * a.fp8_attention
    parts += ["graphs"] * a.cuda_graphs
    return "+".join(parts)


def _split(s: str) -> list[str]:
    return [x.strip() for x in str(s).split(",") if x.strip()]


def precision_args(precision: str, min_gemm_dim: int, master_weights: str = "none",
                   fuse_wgrad_accumulation: bool = False, fp8_attention: bool = False):
    """The `PrecisionArgs` of a bench precision name (FP8 cases never silently fall back: skipped);
    ``fp8_attention`` applies to the FP8 ones."""
    if precision == "fp32":
        return PrecisionArgs(mixed_precision="fp32")
    masters = {"master_weights": master_weights, "fuse_wgrad_accumulation": fuse_wgrad_accumulation}
    if precision == "bf16":
        return PrecisionArgs(mixed_precision="bf16", **masters)
    kw = {} if min_gemm_dim < 0 else {"fp8_min_gemm_dim": min_gemm_dim}
    return PrecisionArgs(use_fp8=True, fp8_recipe=precision.split("-", 1)[1], mixed_precision="bf16", **masters, **kw,
                         fp8_attention=fp8_attention)


def _time_steps(step, warmup: int, steps: int, device) -> tuple[list[float], list, dict]:
    """(seconds of each timed step, every step's loss, {peak_memory_gib, peak_reserved_gib}: None on a CPU):
    ``warmup`` untimed steps, then ``steps`` timed ones, with CUDA events (no host sync inside the timed region)
    or perf_counter on CPU. Both peaks: the allocator's peak of live tensors, and of what it holds from the
    device, which also covers CUDA graphs' private pools (their activations do not show as allocated)."""
    import torch

    losses = [step(i) for i in range(warmup)]
    if device.type != "cuda":
        times = []
        for i in range(steps):
            t0 = time.perf_counter()
            losses.append(step(warmup + i))
            times.append(time.perf_counter() - t0)
        return times, losses, {"peak_memory_gib": None, "peak_reserved_gib": None}
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
    for i, (start, end) in enumerate(events):
        start.record()
        losses.append(step(warmup + i))
        end.record()
    torch.cuda.synchronize(device)  # the only sync: after the timed region
    times = [s.elapsed_time(e) / 1e3 for s, e in events]
    return times, losses, {"peak_memory_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2),
                           "peak_reserved_gib": round(torch.cuda.max_memory_reserved(device) / 2**30, 2)}


def with_speed_defaults(a: BenchCommand, preset: str, precision: str, backend: str, given: set[str],
                        table: dict, facts=None) -> tuple[BenchCommand, dict]:
    """(``a`` with the speed defaults of (backend, preset) that a run of this case would get on the machine of
    ``facts`` (default: this one), those values): the trainer's table and rule (`yxanul.training.speed_defaults`),
    for the flags not on the command line."""
    entry = table.get(backend, {}).get(preset)
    if not a.speed_defaults or entry is None:
        return a, {}
    attention = speed_defaults.attention_here(preset, precision.removeprefix("fp8-"), facts) \
        if precision.startswith("fp8") else None
    launch = speed_defaults.Launch(gradient_checkpointing=a.gradient_checkpointing, torch_compile=a.torch_compile,
                                   bf16_compute=precision != "fp32", fp8_attention=attention)
    current = {k: getattr(a, k) for k in speed_defaults.KEYS}
    chosen = speed_defaults.choose(entry, given, launch, current, fp8=precision.startswith("fp8"))[0]
    return replace(a, **chosen), chosen


def run_case(preset: str, seq: int, micro: int, precision: str, a: BenchCommand, device, profile_dir=None,
             given: set[str] = frozenset(), speed_table: dict | None = None) -> dict:
    """Measure one case; returns a row (status ok / skipped / OOM). ``speed_table``: the speed defaults
    applied to the flags not in ``given`` (None: none)."""
    import torch

    from ..precision import probe_facts, resolve_precision  # torch: --help stays light
    from ..training.step import train_step  # torch: --help stays light

    backend = _config(preset, seq, a).backend  # 'auto' resolved: the table is per backend
    a, applied = with_speed_defaults(a, preset, precision, backend, given, speed_table or {}, probe_facts())
    config = _config(preset, seq, a)
    row = {"preset": preset, "seq_length": seq, "micro_batch": micro, "precision": precision,
           "backend": config.backend, "variant": variant(a), "params": None, "status": "ok", "reason": None,
           "flags": speed_defaults.flag_string(asdict(a)), "speed_defaults": speed_defaults.applied_string(applied)}
    notes: list[str] = []
    if reason := _not_this_case(a, precision, config.backend):
        return {**row, "status": "skipped", "reason": reason}
    model = opt = None
    try:
        plan = resolve_precision(precision_args(precision, a.fp8_min_gemm_dim, a.master_weights,
                                                a.fuse_wgrad_accumulation, a.fp8_attention), config, say=notes.append)
        reason = _skip_reason(precision, plan, device)
        if reason is None:
            model, opt = _build(config, plan, a, device, notes)
            reason = _skip_reason(precision, plan, device)  # the policy may turn FP8 off on seeing the model
        if reason:
            return {**row, "status": "skipped", "reason": reason}
        gen = torch.Generator().manual_seed(1234)
        batches = [torch.randint(0, config.vocab_size, (micro, seq + 1), generator=gen).to(device) for _ in range(2)]
        accum = a.gradient_accumulation_steps  # per-step costs (AdamW, master copies, FP8 weight casts) amortize

        def step(i: int):  # the trainer's own step and batch form: packed (B, T + 1), autocast, FP8, clip, AdamW
            return train_step(model, opt, [batches[(i + j) % 2] for j in range(accum)], plan=plan,
                              max_grad_norm=1.0).loss

        times, losses, peaks = _time_steps(step, a.warmup, a.steps, device)
        row.update(peaks)
        if profile_dir is not None:
            row["profile"] = profile_steps(step, device, Path(profile_dir), row)
        loss_values = [float(v) for v in torch.stack(losses).float().cpu()]
    except torch.OutOfMemoryError:
        return {**row, "status": "OOM", "reason": f"out of memory at micro-batch {micro}"}
    except ConfigError as e:  # e.g. cuda_graphs on the torch backend / a CPU, fp8_attention with fp8-block
        return {**row, "status": "skipped", "reason": str(e)}
    finally:
        model = opt = None  # free before the next case
        _release(device)
    row.update(_measures(config, plan, precision, micro * a.gradient_accumulation_steps, seq, times, loss_values,
                         device), accumulation=a.gradient_accumulation_steps,
               notes="; ".join(notes) or None)
    return row


def _not_this_case(a: BenchCommand, precision: str, backend: str) -> str | None:
    """Why the flags make no sense for this case, before anything is built (else None)."""
    if precision == "fp32" and a.master_weights != "none":
        return "master_weights needs BF16 compute"
    ignored = [k for k in TE_ONLY if getattr(a, k)] + [k for k, v in KERNEL_DEFAULTS.items() if getattr(a, k) != v]
    if backend != "te" and ignored:
        # the torch twin ignores them (a portable config; fuse_wgrad is refused): a row would time the plain model
        return f"{', '.join(ignored)}: Transformer Engine backend only"
    return None


def _config(preset: str, seq: int, a: BenchCommand):
    """The case's model config; 'auto' resolved before the precision plan, as the trainer does (else every
    FP8 case is skipped with "backend is 'auto'", seen on an H100)."""
    from ..models.configuration_yxanul import config_from_preset  # torch: --help stays light
    from ..models.modeling_yxanul import resolve_backend  # torch: --help stays light

    model_flags = {k: getattr(a, k) for k in ("loss_impl", "fuse_qkv_params", "fuse_qkv_rope", "rope_kernel",
                                              "norm_kernel", "cuda_graphs")}
    return config_from_preset(preset, a.vocab_size, seq, backend=resolve_backend(a.backend), **model_flags)


def _build(config, plan, a: BenchCommand, device, notes: list):
    """(model, optimizer) as the trainer builds them: model, policy + read-back (+ master weights), AdamW."""
    import torch

    from ..models.modeling_yxanul import YxanulForCausalLM  # torch: --help stays light

    with torch.device(device):
        model = YxanulForCausalLM(config)
    if a.gradient_checkpointing:
        model.set_activation_checkpointing(True)
    model.train()
    plan.prepare_model(model, say=notes.append)
    opt = build_optimizer(model, OptimArgs())
    if a.torch_compile:
        model = compile_model(model, device.type, plan.fp8_enabled)
    return model, opt


def _skip_reason(precision: str, plan, device) -> str | None:
    """Why a case cannot run as asked (FP8 never silently measured in BF16), else None."""
    import torch

    if precision.startswith("fp8") and not plan.fp8_enabled:
        return plan.fallback_reason
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "this GPU has no BF16"
    return None


def _measures(config, plan, precision: str, sequences: int, seq: int, times: list, loss_values: list,
              device) -> dict:
    """Step time (median, min, max), tokens/s, MFU, FP8 layers and the loss of the timed run (``sequences``:
    per optimizer step, micro-batch x accumulation)."""
    import torch

    from ..models.configuration_yxanul import matmul_parameters  # torch: --help stays light

    dt, tokens = statistics.median(times), sequences * seq
    peak = peak_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    fp8_layers = sum(1 for _, fp8, _ in plan.decisions.values() if fp8)
    return dict(params=matmul_parameters(config), step_ms=round(dt * 1e3, 2),
                step_ms_min=round(min(times) * 1e3, 2), step_ms_max=round(max(times) * 1e3, 2),
                tokens_per_sec=round(tokens / dt, 1),
                mfu_bf16_peak=round(mfu(config.flops_per_token(seq), tokens / dt, peak, 1), 4) if peak else None,
                fp8_layers=f"{fp8_layers}/{len(plan.decisions)}" if plan.decisions else None,
                te_confirmed=(plan.readback or {}).get("fp8_confirmed") if precision.startswith("fp8") else None,
                recipe=plan.recipe_name if plan.fp8_enabled else None,
                loss_first=round(loss_values[0], 4), loss_last=round(loss_values[-1], 4),
                finite=all(math.isfinite(v) for v in loss_values))


def _release(device) -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        from .. import _te  # torch: --help stays light

        _te.reset_fp8_state()  # no stale amax buffers of freed modules between cases


def cases(a: BenchCommand):
    """(preset, seq, micro, precision) in run order: small presets first, precisions side by side."""
    for preset in _split(a.presets):
        for seq in (int(s) for s in _split(a.seq_lengths)):
            micro = a.micro_batch_size or max(1, a.tokens_per_micro // seq)
            for precision in _split(a.precisions):
                yield preset, seq, micro, precision


def run(a: BenchCommand, say=print, on_row=None, given: set[str] = frozenset(),
        speed_table: dict | None = None) -> tuple[list[dict], dict]:
    """Every case in order; ``on_row(rows, env)`` after each (bench.json is rewritten as rows come in, so a
    run cut off by a timeout keeps the cases it finished). ``given``: the flags on the command line (the speed
    defaults of ``speed_table``, default the shipped one, set the others, as in `yxanul train`)."""
    import torch

    speed_table = speed_defaults.load_table() if speed_table is None else speed_table
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    env = environment(device)
    if a.backend == "te" and (env["transformer_engine"] is None or device.type != "cuda"):  # every case would skip
        raise ConfigError("backend", "'auto' or 'torch' here (--backend te needs Transformer Engine and a CUDA device)",
                          "te")
    if a.out:  # what the flag's check cannot see (a read-only filesystem, root), before the first case
        make_out_folder("out", a.out)
    say(f"bench on {env['device_name']} ({device}); torch {env['torch']}, TE {env['transformer_engine']}")
    rows, t0 = [], time.time()
    profile_dir = Path(a.out) if (a.profile and a.out) else None
    todo = list(cases(a))
    from tqdm.auto import tqdm

    for preset, seq, micro, precision in tqdm(todo, desc="bench", unit="case", file=sys.stderr):
        if a.time_limit and rows and time.time() - t0 > a.time_limit:  # the first case always runs
            row = {"preset": preset, "seq_length": seq, "micro_batch": micro, "precision": precision,
                   "status": "skipped", "reason": f"time limit {a.time_limit:.0f}s reached"}
        else:
            row = run_case(preset, seq, micro, precision, a, device, profile_dir, given, speed_table)
        rows.append(row)
        if on_row is not None:
            on_row(rows, env)
        msg = (f"{row['tokens_per_sec']:>12,.0f} tok/s  {row['step_ms']:>8.1f} ms" if row["status"] == "ok"
               else f"{row['status']}: {row['reason']}")
        say(f"{preset:>10} seq {seq:>5} micro {micro:>3} {precision:<12} {msg}")
    return rows, env


def _write(out: Path, a: BenchCommand, rows: list[dict], env: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps({"env": env, "args": asdict(a), "rows": rows}, indent=2))
    (out / "bench.md").write_text(markdown(rows, env))


def main(argv: list[str] | None = None) -> int:
    """`yxanul bench [--presets ...] [--seq_lengths ...] [--precisions ...] [--out DIR]`."""
    a = parse_command(BenchCommand, argv, prog="yxanul bench", description=__doc__.split("\n\n")[0])
    rows, env = run(a, on_row=(lambda rows, env: _write(Path(a.out), a, rows, env)) if a.out else None,
                    given=given_flags(argv))
    print(markdown(rows, env))
    if a.out:
        print(f"wrote {Path(a.out) / 'bench.json'} and {Path(a.out) / 'bench.md'}")
    return 0 if all(r["status"] != "ok" or r.get("finite") for r in rows) else 1

