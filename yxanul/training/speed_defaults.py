"""Speed defaults: per (backend, preset), the speed flags that the device numbers made the default there.

``yxanul/assets/speed_defaults.yaml`` holds them, written by ``python -m yxanul.tools.bench_decide --write`` from
the committed bench JSONs (the rule: >= 1.03x at BF16 and FP8, on the fastest step too, finite losses, FP8 vs
BF16 validation loss within 0.5 % in a parity run with the same flags; docs/benchmarks.md). It may hold backend
``te`` only: the torch backend (every CPU run) has no entry, so the CPU default run's losses cannot change.

At the start of a run (`Trainer.setup`, after ``backend: auto`` is resolved) and per case in ``yxanul bench``, the
entry of the backend and preset sets each of its keys that the user did not set (flag or YAML), with one line
naming the values and the evidence. A default that this launch cannot run is held off, said in the same line,
never turned into a refusal:

- ``cuda_graphs``: a curriculum or the batch finder (the shapes change after capture), gradient checkpointing,
  ``torch_compile``, or several processes (FSDP2 frees the gathered weights a graph would replay; graphs
  under DDP/DeepSpeed have never run on more than one GPU);
- ``master_weights fp32``: several processes (DDP/DeepSpeed keep their own masters, FSDP2 its sharded scheme)
  or fp32 compute;
- ``fuse_qkv_rope``: FSDP2 or DeepSpeed (their checkpoints keep the fused weight by name, in cat[q, k, v] rows);
- ``fuse_wgrad_accumulation``: a run that ends up without ``master_weights fp32`` or a fused QKV (the flag
  needs both);
- ``rope_kernel``: a run that ends up without ``fuse_qkv_rope`` (it is that flag's kernel);
- ``fp8_attention``: a run that is not FP8, or one where TE cannot train it (its recipe, the GPU, the preset's
  head_dim: ``precision.policy.fp8_attention_unsupported``);
- an entry's ``fp8_min_gemm_dim`` (FP8 measured to pay on every layer with the entry's flags): a run without
  all of those flags (one held off, or turned off by the user);
- a resume keeps the values the run was started with (the checkpoint's config.yaml): a newer table never
  changes the numerics of a run half-way.

``speed_defaults: false`` turns all of it off.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from ..checkpoint import RUN_DIR_RESUMES, run_dir_of, saved_config
from ..errors import UserError
from ..flags import given_flags, parse_command, same_as
from ..lint.fsdp import launch_engine
from ..models.args import ModelArgs
from ..models.presets import PRESETS
from ..precision.args import PrecisionArgs
from ..precision.policy import fp8_attention_unsupported

TABLE_FILE = Path(__file__).resolve().parents[1] / "assets" / "speed_defaults.yaml"
SHIPPED_BACKENDS = ("te",)  # the torch backend runs on CPUs: its default must stay the reference


@dataclass
class SpeedFlags:
    """The keys a speed default may set, defined once (the trainer's own fields), in the bench variants' order."""

    loss_impl: Literal["default", "chunked", "te"] = same_as(ModelArgs, "loss_impl")
    fuse_qkv_params: bool = same_as(ModelArgs, "fuse_qkv_params")
    fuse_qkv_rope: bool = same_as(ModelArgs, "fuse_qkv_rope")
    rope_kernel: Literal["te", "triton"] = same_as(ModelArgs, "rope_kernel")
    norm_kernel: Literal["te", "cudnn"] = same_as(ModelArgs, "norm_kernel")
    master_weights: Literal["none", "fp32"] = same_as(PrecisionArgs, "master_weights")
    fuse_wgrad_accumulation: bool = same_as(PrecisionArgs, "fuse_wgrad_accumulation")
    fp8_attention: bool = same_as(PrecisionArgs, "fp8_attention")
    cuda_graphs: bool = same_as(ModelArgs, "cuda_graphs")


KEYS = tuple(f.name for f in dataclasses.fields(SpeedFlags))
FP8_ONLY = ("fp8_attention",)  # inert without FP8: held off in other runs; bench_decide asks them no BF16 gain
# An entry's fp8_min_gemm_dim: FP8 measured to pay on every layer of that preset *with the entry's flags* (eager,
# small-width FP8 loses: its casts and launches cost more than its GEMMs save), so it applies only to a run that
# has all of them. Not a bench variant flag: `yxanul bench` always sets its own.
THRESHOLD = "fp8_min_gemm_dim"
TABLE_KEYS = (*KEYS, THRESHOLD)
SECTION = {"master_weights": "precision", "fuse_wgrad_accumulation": "precision", "fp8_attention": "precision",
           THRESHOLD: "precision"}  # else model


def parse_flags(flags: str, where: str = "speed flags") -> dict[str, Any]:
    """``'--loss_impl te --cuda_graphs'`` -> ``{'loss_impl': 'te', 'cuda_graphs': True}`` (only the keys given)."""
    argv = shlex.split(flags or "")
    values = dataclasses.asdict(parse_command(SpeedFlags, argv, prog=where))
    return {k: v for k, v in values.items() if k in given_flags(argv)}


def flag_string(values: dict[str, Any]) -> str:
    """The canonical flags of ``values``: the keys that differ from the defaults, in `KEYS` order."""
    defaults = dataclasses.asdict(SpeedFlags())
    parts = []
    for k in KEYS:
        v = values.get(k, defaults[k])
        if v != defaults[k]:
            parts.append(f"--{k}" if v is True else f"--{k} {v}")
    return " ".join(parts)


def applied_string(chosen: dict[str, Any]) -> str:
    """What a table entry set (`choose`'s values) as flags: `flag_string` and the threshold."""
    dim = f"--{THRESHOLD} {chosen[THRESHOLD]}" if THRESHOLD in chosen else ""
    return " ".join(x for x in (flag_string(chosen), dim) if x)


def load_table(path: str | Path = TABLE_FILE, backends: tuple[str, ...] = SHIPPED_BACKENDS) -> dict:
    """{backend: {preset: {"values": {...}, "flags": str, "evidence": str}}}; a bad file is one line naming it."""
    raw = yaml.safe_load(Path(path).read_text()) or {}
    return check_table(raw, backends, where=str(path))


def check_table(raw: Any, backends: tuple[str, ...] = SHIPPED_BACKENDS, where: str = "speed defaults") -> dict:
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a mapping backend -> preset -> {{flags, evidence}}")
    out: dict[str, dict] = {}
    for backend, presets in raw.items():
        if backend not in backends:
            raise UserError(f"{where}: backend '{backend}' cannot have speed defaults (allowed: {', '.join(backends)})")
        out[backend] = {}
        for preset, entry in (presets or {}).items():
            if preset not in PRESETS:
                raise UserError(f"{where}: {backend}.{preset}: not a preset (one of {', '.join(PRESETS)})")
            if not isinstance(entry, dict) or not isinstance(entry.get("flags"), str) or not entry.get("evidence"):
                raise UserError(f"{where}: {backend}.{preset}: expected {{flags: '--key value ...', evidence: ...}}")
            values = parse_flags(entry["flags"], where=f"{where}: {backend}.{preset}")
            dim = entry.get(THRESHOLD)
            if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or dim < 0):
                raise UserError(f"{where}: {backend}.{preset}.{THRESHOLD}: expected an integer >= 0, got {dim!r}")
            out[backend][preset] = {"values": values, "flags": flag_string(values), "evidence": entry["evidence"],
                                    THRESHOLD: dim}
    return out


@dataclass(frozen=True)
class Launch:
    """What a run does that some speed flags cannot run with (`held_off`)."""

    processes: int = 1
    engine: str = "none"  # fsdp2 / deepspeed: refuse both flags even with one process (lint/fsdp.py, master_weights)
    fixed_shapes: bool = True  # no curriculum, no batch finder
    gradient_checkpointing: bool = False
    torch_compile: bool = False
    bf16_compute: bool = True
    fp8_attention: str | None = None  # why TE cannot train FP8 attention in this run (None: it can)


def held_off(key: str, value: Any, launch: Launch) -> str | None:
    """Why this launch keeps the default ``key: value`` off (None: it can run it)."""
    several = launch.engine if launch.engine != "none" else f"{launch.processes} processes"
    if key == "cuda_graphs" and value:
        if launch.processes > 1 or launch.engine != "none":
            return several
        if not launch.fixed_shapes:
            return "the micro-batch or seq_length changes (curriculum / batch finder)"
        if launch.gradient_checkpointing:
            return "gradient_checkpointing"
        if launch.torch_compile:
            return "torch_compile"
    if key == "master_weights" and value == "fp32":
        if launch.processes > 1 or launch.engine != "none":
            return several
        if not launch.bf16_compute:
            return "fp32 compute"
    if key == "fuse_qkv_rope" and value and launch.engine != "none":
        return launch.engine
    if key == "fp8_attention" and value and launch.fp8_attention:
        return launch.fp8_attention
    return None


def choose(entry: dict, user_keys, launch: Launch, current: dict, fp8: bool) -> tuple[dict, dict]:
    """(values to set, {key: why held off}) of a table ``entry`` for the keys the user did not set. ``current``:
    the run's values of `KEYS` before the table; ``fp8``: an FP8 run. The entry's `THRESHOLD` comes last: it
    applies only where the run ends up with every flag of the entry (it was measured with them)."""
    chosen, held = {}, {}
    for key, value in entry["values"].items():
        if key in user_keys:
            continue
        why = held_off(key, value, launch)
        if why:
            held[key] = why
        else:
            chosen[key] = value
    would = {**current, **chosen}
    if chosen.get("fuse_wgrad_accumulation") and (would["master_weights"] != "fp32"
                                                  or not (would["fuse_qkv_params"] or would["fuse_qkv_rope"])):
        del chosen["fuse_wgrad_accumulation"]
        held["fuse_wgrad_accumulation"] = "no master_weights fp32 or fused QKV in this run"
    for key in FP8_ONLY:
        if chosen.get(key) and not fp8:
            del chosen[key]
            held[key] = "not an FP8 run"
    if chosen.get("rope_kernel", "te") != "te" and not would["fuse_qkv_rope"]:
        del chosen["rope_kernel"]
        held["rope_kernel"] = "no fuse_qkv_rope in this run"
    dim = entry.get(THRESHOLD)
    if dim is not None and fp8 and THRESHOLD not in user_keys:
        would = {**current, **chosen}
        missing = {k: v for k, v in entry["values"].items() if would[k] != v}
        if missing:
            held[THRESHOLD] = f"measured with {flag_string(missing)}, which this run does not have"
        else:
            chosen[THRESHOLD] = dim
    return chosen, held


def apply(cfg, backend: str, table: dict, launch: Launch, previous: dict | None = None) -> tuple[Any, str | None]:
    """(``cfg`` with its speed defaults set, the one line saying so). ``cfg``: a resolved `yxanul.config.Config`;
    ``previous``: the flat config of the run a resume continues: its values of `TABLE_KEYS` that the user did not
    set win over the table's (whatever the table holds now, or no longer holds)."""
    if not cfg.train.speed_defaults:
        return cfg, None
    entry = table.get(backend, {}).get(cfg.model.model)
    current = {k: getattr(cfg.precision if SECTION.get(k) else cfg.model, k) for k in TABLE_KEYS}
    chosen, held = choose(entry, cfg.user_keys, launch, current, cfg.precision.use_fp8) if entry else ({}, {})
    would = current | chosen
    previous = {k: previous[k] for k in TABLE_KEYS if k in (previous or {}) and k not in cfg.user_keys}
    kept = {k: v for k, v in previous.items() if v != would[k]}
    final = {**chosen, **kept}
    if not (final or held):
        return cfg, None
    sections = {}
    for name in ("model", "precision"):
        kw = {k: v for k, v in final.items() if SECTION.get(k, "model") == name}
        if kw:
            sections[name] = dataclasses.replace(getattr(cfg, name), **kw)
    chosen = {k: v for k, v in chosen.items() if k not in kept}
    return dataclasses.replace(cfg, **sections), _line(backend, cfg.model.model, entry, chosen, held, kept)


def _line(backend: str, preset: str, entry: dict | None, chosen: dict, held: dict, kept: dict) -> str:
    parts = [f"speed defaults for {backend}/{preset}" + (f" ({entry['evidence']})" if entry else "") + ": "
             + (applied_string(chosen) or "none applied")]
    parts += [f"kept off: {k} ({why})" for k, why in held.items() if k not in kept]
    if kept:
        parts.append("the resumed run keeps " + ", ".join(f"{k} {v}" for k, v in kept.items()))
    return "; ".join(parts) + " (--speed_defaults false: none)"


def launch_of(cfg, env, facts=None) -> Launch:
    """The `Launch` of a run of ``cfg`` under the environment ``env`` (``WORLD_SIZE`` as accelerate exports it) on
    the machine of ``facts`` (`precision.probe_facts`; None: FP8 attention judged by recipe and shape alone)."""
    b, p = cfg.batch, cfg.precision
    return Launch(processes=int(env.get("WORLD_SIZE", "1") or 1), engine=launch_engine(env),
                  fixed_shapes=not (b.auto_batch_size or b.curriculum),
                  gradient_checkpointing=cfg.model.gradient_checkpointing, torch_compile=cfg.train.torch_compile,
                  bf16_compute=p.mixed_precision != "fp32",
                  fp8_attention=attention_here(cfg.model.model, p.fp8_recipe, facts) if p.use_fp8 else None)


def attention_here(preset: str, recipe: str, facts=None) -> str | None:
    """`fp8_attention_unsupported` for ``preset``'s heads under ``recipe`` on the machine of ``facts`` (None: a
    GPU that takes what the recipe and head_dim allow, sm_100+)."""
    shape = PRESETS[preset]
    cc = facts.compute_capability if facts is not None else (10, 0)
    return fp8_attention_unsupported(recipe, shape["hidden_size"] // shape["num_attention_heads"], cc,
                                     getattr(facts, "device_name", None), getattr(facts, "te_version", None))


def resumed_config(cfg) -> dict | None:
    """The flat config of the run a ``resume`` continues (its checkpoint's or run directory's config.yaml), or
    None for a new run. Read before anything is built: the run directory is `run_dir_of` the config."""
    resume = cfg.checkpoint.resume
    if not resume:
        return None
    return saved_config(run_dir_of(cfg) if resume in RUN_DIR_RESUMES else resume) or None


def for_run(cfg, backend: str, table: dict | None = None, env=None, probes: bool = False,
            facts=None) -> tuple[Any, str | None]:
    """`apply` to a `yxanul train` run: the shipped table (or ``table``), the launch of ``env`` on the machine of
    ``facts`` (default: this one), the resumed run's values. ``backend``: te or torch (``auto`` resolved).
    ``probes``: the micro-batch changes (find-batch)."""
    table = load_table() if table is None else table
    launch = launch_of(cfg, os.environ if env is None else env, facts)
    if probes:
        launch = dataclasses.replace(launch, fixed_shapes=False)
    return apply(cfg, backend, table, launch, resumed_config(cfg))
