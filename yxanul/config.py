"""One flat, strict configuration assembled from each component's ``*Args`` dataclass.

Sources, later wins: dataclass defaults < YAML file (``--config FILE``, flat ``key: value``) <
command-line flags (``--key value``). Unknown keys and bad values are :class:`ConfigError`s
naming the key and what is allowed (nanotron-style strictness). Why not ``HfArgumentParser``:
it cannot merge a YAML file under CLI overrides, has no YAML-only fields (lists of dicts such as
``datasets`` or ``curriculum``) and prints argparse's multi-line usage on errors.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from pathlib import Path
from typing import Any

import yaml

from .checkpoint import CheckpointArgs
from .config_file import DEFAULT_CONFIG, embedded_defaults, load_yaml
from .data.args import DataArgs
from .errors import ConfigError
from .evaluation.args import EvalTaskArgs
from .flags import (
    GivenOnce,
    OneLineParser,
    add_field,
    bare_booleans,
    coerce,
    merge,
    parse_known,
    strip_optional,
    underscored,
)
from .hub.args import HubArgs
from .models.args import ModelArgs
from .precision.args import PrecisionArgs
from .tracking import TrackingArgs
from .training.args import TrainArgs
from .training.batching.args import BatchArgs
from .training.optim import OptimArgs
from .training.schedule import warmup_steps_for_tokens


def _sections() -> list[tuple[str, type]]:
    # Each component owns its dataclass; none of these modules imports torch (tests/test_config.py checks it).

    return [
        ("train", TrainArgs), ("model", ModelArgs), ("data", DataArgs), ("batch", BatchArgs),
        ("optim", OptimArgs), ("precision", PrecisionArgs), ("checkpoint", CheckpointArgs),
        ("tracking", TrackingArgs), ("hub", HubArgs), ("tasks", EvalTaskArgs),
    ]


@dataclasses.dataclass
class Config:
    """The resolved configuration: one attribute per component, typed with its section (``cfg.optim.max_lr``)."""

    train: TrainArgs
    model: ModelArgs
    data: DataArgs
    batch: BatchArgs
    optim: OptimArgs
    precision: PrecisionArgs
    checkpoint: CheckpointArgs
    tracking: TrackingArgs
    hub: HubArgs | None = None
    tasks: EvalTaskArgs | None = None
    source: str | None = None  # the YAML file it came from, if any
    notes: list = dataclasses.field(default_factory=list)  # defaults adapted to the user's values, one line each
    user_keys: frozenset = frozenset()  # the keys the user set (flag or YAML): what no default may change

    def to_flat_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, _ in _sections():
            out.update(dataclasses.asdict(getattr(self, name)))
        return out

    def save(self, path: str | os.PathLike) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_flat_dict(), sort_keys=False))


def _fields() -> dict[str, tuple[str, dataclasses.Field, Any]]:
    """key -> (section, field, resolved type). Keys are globally unique (flat CLI)."""
    out: dict[str, tuple[str, dataclasses.Field, Any]] = {}
    for section, cls in _sections():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in out:
                raise RuntimeError(f"config key {f.name!r} defined twice ({out[f.name][0]}, {section})")
            out[f.name] = (section, f, hints[f.name])
    return out


def config_keys() -> frozenset[str]:
    """Every key of a training config: what a command that reads part of one (`yxanul prepare --config`)
    ignores, and nothing else."""
    return frozenset(_fields())


# --------------------------------------------------------------------------- parsing
def build_parser(prog: str = "yxanul train") -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=prog,
        description="Pretrain a decoder-only LM. Values come from the embedded default run (yxanul/assets/"
        "default.yaml) without --config, else from the defaults below and --config FILE (flat YAML); then these "
        "flags.",
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,
    )
    parser.add_argument("--config", action=GivenOnce, help="YAML file with flat `key: value` pairs (any key below).")
    groups: dict[str, argparse._ArgumentGroup] = {}
    embedded = embedded_defaults()
    for key, (section, f, tp) in _fields().items():
        if section not in groups:
            groups[section] = parser.add_argument_group(section)
        add_field(groups[section], key, f, tp, embedded)
    return parser


# a flag replaces the file's warmup in the other unit (later wins)
WARMUP_REPLACES = {"warmup_steps": "warmup_tokens", "warmup_tokens": "warmup_steps"}


def resolve(yaml_values: dict[str, Any] | None = None, cli_values: dict[str, Any] | None = None,
            source: str | None = None, user_keys: set[str] | None = None) -> Config:
    """Merge defaults < YAML < CLI (:func:`yxanul.flags.merge`, strict: a key of no section is one line),
    validate every value, build each section's dataclass. ``user_keys``: the keys the user chose (default:
    every key given here); a default that conflicts with them adapts (`_adapt_defaults`) instead of being
    refused."""
    fields = _fields()
    user_keys = set(yaml_values or {}) | set(cli_values or {}) if user_keys is None else user_keys
    merged = merge({k: tp for k, (_, _, tp) in fields.items()}, yaml_values, cli_values, replaces=WARMUP_REPLACES)
    notes = _adapt_defaults(merged, user_keys, fields)
    per_section: dict[str, dict[str, Any]] = {name: {} for name, _ in _sections()}
    for key, value in merged.items():
        per_section[fields[key][0]][key] = value
    built: dict[str, Any] = {}
    for name, cls in _sections():  # optim after model and batch: warmup_tokens needs their tokens per step
        if name == "optim":
            _warmup_in_steps(per_section[name], built["batch"], built["model"].seq_length)
        built[name] = cls(**per_section[name])
    cfg = Config(**built, source=source, notes=notes, user_keys=frozenset(user_keys))
    _cross_checks(cfg)
    return cfg


# a default warmup longer than the run becomes 1/10 of it: both defaults' share (30 of 300, 100 of 1000 steps)
ADAPTED_WARMUP_SHARE = 10


def _adapt_defaults(merged: dict[str, Any], user_keys: set[str], fields) -> list[str]:
    """A default warmup longer than the user's ``max_steps`` shrinks to a tenth of the run, with one line
    saying so. Values the user set are never changed: their conflict stays an error (`_cross_checks`)."""
    if {"warmup_steps", "warmup_tokens", "lr_decay_steps"} & user_keys or merged.get("lr_decay_steps") is not None:
        return []
    if merged.get("warmup_tokens") is not None:
        return []
    warmup, max_steps = (merged.get(k, fields[k][1].default) for k in ("warmup_steps", "max_steps"))
    if warmup < max_steps:
        return []
    merged["warmup_steps"] = min(-(-max_steps // ADAPTED_WARMUP_SHARE), max_steps - 1)  # rounded up, below max_steps
    return [f"warmup_steps: the default {warmup} is longer than max_steps {max_steps}: warming up for "
            f"{merged['warmup_steps']} step(s) instead (a tenth of the run; set --warmup_steps to choose)"]


def tokens_per_step_of(batch, seq_length: int, world_size: int | None = None) -> int | None:
    """The tokens per optimizer step a run will use, known before anything is built: the target
    (``target_tokens_per_step``, or ``target_effective_batch_size`` x ``seq_length``), else
    micro x accumulation x world x seq_length (world: ``$WORLD_SIZE``, as set by accelerate/torchrun;
    1 if unset). None with ``auto_batch_size`` and no target (the micro-batch is found at run time)."""
    if batch.target_tokens_per_step:
        return batch.target_tokens_per_step
    if batch.target_effective_batch_size:
        return batch.target_effective_batch_size * seq_length
    if batch.auto_batch_size:
        return None
    world = world_size if world_size is not None else int(os.environ.get("WORLD_SIZE", "1") or 1)
    return batch.micro_batch_size * batch.gradient_accumulation_steps * max(1, world) * seq_length


def _warmup_in_steps(optim: dict[str, Any], batch, seq_length: int) -> None:
    """``warmup_tokens`` -> ``warmup_steps`` (rounded up), once, here: the resolved config (run_dir's
    config.yaml, each checkpoint's) stores both, and such a file loads again (equal values)."""
    if optim.get("warmup_tokens") is not None:
        apply_warmup_tokens(optim, tokens_per_step_of(batch, seq_length))


def apply_warmup_tokens(values: dict[str, Any], tokens_per_step: int | None) -> None:
    """Set ``values['warmup_steps']`` from ``values['warmup_tokens']``; a different ``warmup_steps`` given
    too is one line naming both (``yxanul plot-lr`` uses this as well)."""
    tokens = values["warmup_tokens"]
    if tokens_per_step is None:
        raise ConfigError("warmup_tokens", "a fixed number of tokens per optimizer step to convert it to steps (set "
                          "target_tokens_per_step, or give the warmup as warmup_steps)", tokens)
    steps = warmup_steps_for_tokens(tokens, tokens_per_step)
    if values.get("warmup_steps") is not None and values["warmup_steps"] != steps:
        raise ConfigError("warmup_steps", f"unset when warmup_tokens is set (warmup_tokens {tokens:,} = {steps} "
                          f"steps of {tokens_per_step:,} tokens; set one of them)", values["warmup_steps"])
    values["warmup_steps"] = steps


def _cross_checks(cfg: Config) -> None:
    """Values that are each valid but wrong together (one section cannot see the other)."""
    warmup, max_steps, tokens = cfg.optim.warmup_steps, cfg.train.max_steps, cfg.optim.warmup_tokens
    # step s (1-based) takes lr_at(s - 1), which is max_lr from warmup_steps on: the last step must be past it
    if cfg.optim.lr_decay_steps is None and warmup >= max_steps:
        if tokens is not None:
            raise ConfigError("warmup_tokens", f"less than max_steps ({max_steps}) steps' worth: {tokens:,} tokens "
                              f"are {warmup} steps and the learning rate would never reach max_lr (lower "
                              "warmup_tokens, or set lr_decay_steps for a longer schedule)", tokens)
        raise ConfigError("warmup_steps", f"less than max_steps ({max_steps}): the learning rate would never reach "
                          f"max_lr (set --warmup_steps < {max_steps}, or lr_decay_steps for a longer schedule)",
                          warmup)
    if cfg.precision.fp8_weight_all_gather:
        _fp8_weight_all_gather_checks(cfg)


def _fp8_weight_all_gather_checks(cfg: Config) -> None:
    """What FP8 weights (TE quantized_model_init) under FSDP2 need from the other sections; the launch
    (an FSDP2 profile) is checked by the launch preflight, FP8 really on by the precision plan."""
    p, m = cfg.precision, cfg.model
    if not p.use_fp8:
        raise ConfigError("fp8_weight_all_gather", "false without use_fp8 (the weights are FP8 only when TE "
                                                   "trains in FP8)", True)
    if p.fp8_recipe not in ("delayed", "current"):
        raise ConfigError("fp8_weight_all_gather", f"false with fp8_recipe {p.fp8_recipe} (TE's FSDP2 hooks take "
                                                   "FP8 weights built on the GPU for the per-tensor recipes only: "
                                                   "delayed, current)", True)
    if not m.fuse_qkv_params:
        raise ConfigError("fuse_qkv_params", "true with fp8_weight_all_gather (TE cannot split one FP8 QKV "
                                             "weight into q/k/v parameters)", False)
    conflicts = {"backend": (m.backend == "torch", "FP8 weights are TE modules' (backend te or auto)"),
                 "master_weights": (p.master_weights == "fp32", "TE's FusedAdam keeps the fp32 masters here"),
                 "cuda_graphs": (m.cuda_graphs, "FSDP2's all-gathers run between the layers a graph would hold")}
    for key, (bad, why) in conflicts.items():
        if bad:
            raise ConfigError("fp8_weight_all_gather", f"false with {key} {getattr(m, key, None) or getattr(p, key)} "
                                                       f"({why})", True)


def parse_args(argv: list[str] | None = None, prog: str = "yxanul train") -> Config:
    """Parse CLI flags (and the YAML they point to) into a validated :class:`Config`."""
    fields = _fields()
    bools = {k for k, (_, _, tp) in fields.items() if strip_optional(tp)[0] is bool}
    argv = [a for a in argv or () if a != "--"]  # a `--` before the flags separates nothing: train has no positionals
    ns = parse_known(build_parser(prog), bare_booleans(underscored(argv, fields), bools), fields)
    path = coerce("config", str | None, ns.pop("config", None), from_cli=True)  # `--config ""`: one line
    yaml_values = load_yaml(path) if path else {}
    embedded = path is not None and os.path.abspath(path) == os.path.abspath(DEFAULT_CONFIG)
    cfg = resolve(yaml_values, ns, source=path, user_keys=set(ns) | (set() if embedded else set(yaml_values)))
    if os.environ.get("RANK", "0") == "0":  # once per run, at startup
        for line in cfg.notes + ([warmup_line(cfg)] if cfg.optim.warmup_tokens is not None else []):
            print(line, flush=True)
    return cfg


def warmup_line(cfg: Config) -> str:
    """'warmup 100,000,000 tokens = 763 steps (131,072 tokens per optimizer step)' (warmup_tokens set)."""
    tps = tokens_per_step_of(cfg.batch, cfg.model.seq_length)
    return (f"warmup {cfg.optim.warmup_tokens:,} tokens = {cfg.optim.warmup_steps:,} steps ({tps:,} tokens per "
            "optimizer step, rounded up)")
