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
import difflib
import os
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml

from .errors import ConfigError, UserError

_MISSING = object()


def _sections() -> list[tuple[str, type]]:
    # Imported lazily so `yxanul --help` stays fast and each component owns its dataclass.
    # None of these modules imports torch (tests/test_config.py checks it).
    from .batching.args import BatchArgs
    from .checkpoint import CheckpointArgs
    from .data.args import DataArgs
    from .models.args import ModelArgs
    from .optim import OptimArgs
    from .precision.args import PrecisionArgs
    from .tracking import TrackingArgs
    from .train_args import TrainArgs

    return [
        ("train", TrainArgs), ("model", ModelArgs), ("data", DataArgs), ("batch", BatchArgs),
        ("optim", OptimArgs), ("precision", PrecisionArgs), ("checkpoint", CheckpointArgs),
        ("tracking", TrackingArgs),
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
    source: str | None = None  # the YAML file it came from, if any

    def to_flat_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, _ in _sections():
            out.update(dataclasses.asdict(getattr(self, name)))
        return out

    def save(self, path: str | os.PathLike) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_flat_dict(), sort_keys=False))


# --------------------------------------------------------------------------- field typing
def _strip_optional(tp) -> tuple[Any, bool]:
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        optional = len(args) < len(get_args(tp))
        return (args[0] if len(args) == 1 else tp), optional
    return tp, False


def _describe(tp) -> str:
    base, optional = _strip_optional(tp)
    if get_origin(base) is Literal:
        s = "one of " + ", ".join(repr(a) for a in get_args(base))
    elif base is bool:
        s = "true or false"
    elif base is int:
        s = "an integer"
    elif base is float:
        s = "a number"
    elif base is str:
        s = "a string"
    elif get_origin(base) is list or base is list:
        s = "a list (YAML only)"
    elif get_origin(base) is dict or base is dict:
        s = "a mapping (YAML only)"
    else:
        s = str(base)
    return s + (" or null" if optional else "")


def _coerce(key: str, tp, value, from_cli: bool):
    """Convert/validate ``value`` for a field of type ``tp``; raise ConfigError naming ``key``."""
    base, optional = _strip_optional(tp)
    if value is None or (from_cli and optional and str(value).lower() in ("none", "null")):
        if optional:
            return None
        raise ConfigError(key, _describe(tp), value)
    try:
        if get_origin(base) is Literal:
            choices = get_args(base)
            if value in choices:
                return value
            if from_cli or isinstance(value, str):
                for c in choices:
                    if str(c) == str(value):
                        return c
            raise ValueError
        if base is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
                return True
            if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if base is int:
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, int):
                return value
            if isinstance(value, float) and value.is_integer():
                return int(value)
            if isinstance(value, str):
                f = float(value.replace("_", ""))
                if f.is_integer():
                    return int(f)
            raise ValueError
        if base is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if base is str:
            if isinstance(value, (dict, list)):
                raise ValueError
            return str(value)
        if get_origin(base) is list or base is list:
            if from_cli:
                raise ConfigError(key, "a list, which can only be set in the YAML config file")
            if not isinstance(value, list):
                raise ValueError
            return value
        if get_origin(base) is dict or base is dict:
            if from_cli:
                raise ConfigError(key, "a mapping, which can only be set in the YAML config file")
            if not isinstance(value, dict):
                raise ValueError
            return value
    except (ValueError, TypeError):
        raise ConfigError(key, _describe(tp), value) from None
    return value


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


def _unknown(key: str, known) -> ConfigError:
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f"did you mean '{close[0]}'?" if close else "see `yxanul train --help`"
    return ConfigError(key, f"a known config key ({hint})")


# --------------------------------------------------------------------------- parsing
class _OneLineParser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print usage + exit; we want one line
        raise UserError(message)


def build_parser(prog: str = "yxanul train") -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog=prog,
        description="Pretrain a decoder-only LM. Values come from dataclass defaults, then "
        "--config FILE (flat YAML), then these flags.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,
    )
    parser.add_argument("--config", help="YAML file with flat `key: value` pairs (any key below).")
    groups: dict[str, argparse._ArgumentGroup] = {}
    for key, (section, f, tp) in _fields().items():
        if section not in groups:
            groups[section] = parser.add_argument_group(section)
        base, _ = _strip_optional(tp)
        help_ = f.metadata.get("help", "")
        default = f.default if f.default is not dataclasses.MISSING else None
        kw: dict[str, Any] = {"help": f"{help_} ({_describe(tp)}; default: {default!r})"}
        if base is bool:
            kw.update(nargs="?", const="true", metavar="BOOL")
        elif get_origin(base) is Literal:
            kw.update(metavar="{" + ",".join(str(c) for c in get_args(base)) + "}")
        groups[section].add_argument(f"--{key}", dest=key, **kw)
    return parser


def load_yaml(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"config file '{path}': no such file")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"config file '{path}':{where} is not valid YAML ({getattr(e, 'problem', e)})") from None
    except UnicodeDecodeError:
        raise UserError(f"config file '{path}': not UTF-8 text") from None
    if data is None:
        return {}
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
                raise _unknown(key, fields)
            merged[key] = _coerce(key, fields[key][2], value, from_cli=(origin == "cli"))
    per_section: dict[str, dict[str, Any]] = {name: {} for name, _ in _sections()}
    for key, value in merged.items():
        per_section[fields[key][0]][key] = value
    built = {name: cls(**per_section[name]) for name, cls in _sections()}
    return Config(**built, source=source)


def parse_args(argv: list[str] | None = None, prog: str = "yxanul train") -> Config:
    """Parse CLI flags (and the YAML they point to) into a validated :class:`Config`."""
    parsed, extra = build_parser(prog).parse_known_args(argv)
    if extra:  # a misspelt flag gets the same one line as a misspelt YAML key, with a suggestion
        flag = next((a for a in extra if a.startswith("--")), None)
        if flag is None:
            raise UserError(f"unexpected argument '{extra[0]}' (flags are --key value)")
        raise _unknown(flag[2:].split("=", 1)[0], _fields())
    ns = vars(parsed)
    path = ns.pop("config", None)
    yaml_values = load_yaml(path) if path else {}
    return resolve(yaml_values, ns, source=path)
