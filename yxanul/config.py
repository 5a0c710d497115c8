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

from .errors import ConfigError, UserError
from .flags import OneLineParser, add_field, bare_booleans, coerce, parse_known, strip_optional, unknown_key


def _sections() -> list[tuple[str, type]]:
    # Imported lazily so `yxanul --help` stays fast and each component owns its dataclass.
    # None of these modules imports torch (tests/test_config.py checks it).
    from .batching.args import BatchArgs
    from .checkpoint import CheckpointArgs
    from .data.args import DataArgs
    from .evaluation.args import EvalTaskArgs
    from .hub.args import HubArgs
    from .models.args import ModelArgs
    from .optim import OptimArgs
    from .precision.args import PrecisionArgs
    from .tracking import TrackingArgs
    from .training.args import TrainArgs

    return [
        ("train", TrainArgs), ("model", ModelArgs), ("data", DataArgs), ("batch", BatchArgs),
        ("optim", OptimArgs), ("precision", PrecisionArgs), ("checkpoint", CheckpointArgs),
        ("tracking", TrackingArgs), ("hub", HubArgs), ("tasks", EvalTaskArgs),
    ]


@dataclasses.dataclass
class Config:
    """The resolved configuration: one attribute per component."""

    train: Any
    model: Any
    data: Any
    batch: Any
    optim: Any
    precision: Any
    checkpoint: Any
    tracking: Any
    hub: Any = None    # HubArgs (yxanul/hub/args.py)
    tasks: Any = None  # EvalTaskArgs (yxanul/evaluation/args.py)
    source: str | None = None  # the YAML file it came from, if any

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


# --------------------------------------------------------------------------- parsing
def build_parser(prog: str = "yxanul train") -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=prog,
        description="Pretrain a decoder-only LM. Values come from dataclass defaults, then "
        "--config FILE (flat YAML), then these flags.",
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,
    )
    parser.add_argument("--config", help="YAML file with flat `key: value` pairs (any key below).")
    groups: dict[str, argparse._ArgumentGroup] = {}
    for key, (section, f, tp) in _fields().items():
        if section not in groups:
            groups[section] = parser.add_argument_group(section)
        add_field(groups[section], key, f, tp)
    return parser


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' given twice (lines {seen[key]} and {line}; the last would win silently)",
                    key_node.start_mark)
            if isinstance(key, (str, int, float, bool)):
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: str) -> dict[str, Any]:
    """A flat ``key: value`` YAML file; an empty file, a key given twice or a non-mapping is one line."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"config file '{path}': no such file")
    try:
        data = yaml.load(p.read_text(encoding="utf-8"), Loader=_StrictLoader)  # noqa: S506 (a SafeLoader)
    except yaml.constructor.ConstructorError as e:
        mark = e.problem_mark
        raise UserError(f"config file '{path}': line {mark.line + 1}: {e.problem}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"config file '{path}':{where} is not valid YAML ({getattr(e, 'problem', e)})") from None
    except UnicodeDecodeError:
        raise UserError(f"config file '{path}': not UTF-8 text") from None
    if data is None:
        raise UserError(f"config file '{path}': empty (expected flat `key: value` lines, e.g. `max_steps: 100`)")
    if not isinstance(data, dict):
        raise UserError(f"config file '{path}': expected a mapping of `key: value` at the top level")
    return data


def resolve(yaml_values: dict[str, Any] | None = None, cli_values: dict[str, Any] | None = None,
            source: str | None = None) -> Config:
    """Merge defaults < YAML < CLI, validate every value, build each section's dataclass."""
    fields = _fields()
    merged: dict[str, Any] = {}
    for origin, values in (("yaml", yaml_values or {}), ("cli", cli_values or {})):
        for key, value in values.items():
            if key not in fields:
                raise unknown_key(key, fields, where="see `yxanul train --help`")
            merged[key] = coerce(key, fields[key][2], value, from_cli=(origin == "cli"))
    per_section: dict[str, dict[str, Any]] = {name: {} for name, _ in _sections()}
    for key, value in merged.items():
        per_section[fields[key][0]][key] = value
    built = {name: cls(**per_section[name]) for name, cls in _sections()}
    cfg = Config(**built, source=source)
    _cross_checks(cfg)
    return cfg


def _cross_checks(cfg: Config) -> None:
    """Values that are each valid but wrong together (one section cannot see the other)."""
    warmup, max_steps = cfg.optim.warmup_steps, cfg.train.max_steps
    if cfg.optim.lr_decay_steps is None and warmup > max_steps:
        raise ConfigError("warmup_steps", f"at most max_steps ({max_steps}): the learning rate would never reach "
                          f"max_lr (set --warmup_steps <= {max_steps}, or lr_decay_steps for a longer schedule)", warmup)


def parse_args(argv: list[str] | None = None, prog: str = "yxanul train") -> Config:
    """Parse CLI flags (and the YAML they point to) into a validated :class:`Config`."""
    fields = _fields()
    bools = {k for k, (_, _, tp) in fields.items() if strip_optional(tp)[0] is bool}
    ns = parse_known(build_parser(prog), bare_booleans(list(argv or []), bools), fields)
    path = ns.pop("config", None)
    yaml_values = load_yaml(path) if path else {}
    return resolve(yaml_values, ns, source=path)
