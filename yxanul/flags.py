"""The one CLI builder: dataclass fields -> command-line flags, for every `yxanul` subcommand.

A command declares its arguments as a dataclass (litgpt style: the signature is the schema) and calls
:func:`parse_command`. Each field becomes ``--name`` with its ``metadata["help"]``; a field with
``metadata={"positional": True}`` is a positional argument (``list[...]`` ones take one or more);
``metadata={"aliases": ["--old-name"]}`` keeps an old spelling of a flag working; ``metadata={"once": True}``
refuses the flag given twice (``--config``: the second file would silently replace the first).
Types: int, float, str, bool (a bare ``--flag`` means true; ``--flag false`` works too), ``X | None``,
``Literal[...]`` (choices), ``list[int|float|str]`` (several values after the flag), and
``list[dict]``/``dict`` (YAML only). Every mistake is one line (a :class:`~yxanul.errors.UserError`,
exit code 2) naming the flag and what was expected, with "did you mean" for misspelt flags.

A command's field that is a config key reuses the section's field (:func:`same_as`); YAML + flags are
merged by :func:`merge` (modes ``strict`` and ``subset``).

Why not ``HfArgumentParser``: it cannot merge a YAML file under CLI overrides, has no YAML-only fields,
and prints argparse's multi-line usage on errors. ``yxanul train`` uses the same pieces over all the
config sections (:mod:`yxanul.config`).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import types
import typing
from collections.abc import Collection
from typing import Any, Literal, TypeVar, get_args, get_origin

from .config_file import embedded_defaults
from .errors import ConfigError, UserError
from .foreign_keys import FOREIGN_VALUES, yxanul_key_for

T = TypeVar("T")
_BOOL_WORDS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False,
               "off": False}


# --------------------------------------------------------------------------- field typing
def strip_optional(tp) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (tp, False)."""
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        optional = len(args) < len(get_args(tp))
        return (args[0] if len(args) == 1 else tp), optional
    return tp, False


def _is_list(tp) -> bool:
    return get_origin(tp) is list or tp is list


def _list_item(tp):
    args = get_args(tp)
    return args[0] if args else str


def describe(tp) -> str:
    """What a value of type ``tp`` must be, in words (for error messages and --help)."""
    base, optional = strip_optional(tp)
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
    elif _is_list(base) and _list_item(base) in (int, float, str):
        s = f"a list of {describe(_list_item(base)).split(' ', 1)[1]}s"
    elif _is_list(base):
        s = "a list (YAML only)"
    elif get_origin(base) is dict or base is dict:
        s = "a mapping (YAML only)"
    else:
        s = str(base)
    return s + (" or null" if optional else "")


def _scalar(base, value, from_cli: bool):
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
        if isinstance(value, (str, int)) and str(value).lower() in _BOOL_WORDS:  # YAML's 0/1 as the flag's 0/1
            return _BOOL_WORDS[str(value).lower()]
        raise ValueError
    if base is int:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            text = value.replace("_", "").strip()
            if text.lstrip("+-").isdigit():  # exact, however long (a float would round 10**23)
                return int(text)
            f = float(text)
            if f.is_integer() and abs(f) < 2**53:  # 2e8: exact; past 2**53 a float is not the number typed
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
    return value


def whole_number(value) -> int | None:
    """``value`` as an int the way an int field reads it (``200_000_000``, ``2e8``, ``2.0e8``), else None.
    YAML 1.1 reads ``2e8`` (no dot) as a string, so strings are read like a flag's value."""
    try:
        return _scalar(int, value, from_cli=False)
    except (ValueError, TypeError):
        return None


def coerce(key: str, tp, value, from_cli: bool):
    """Convert/validate ``value`` for a field of type ``tp``; raise ConfigError naming ``key``."""
    base, optional = strip_optional(tp)
    own = get_origin(base) is Literal and value in get_args(base)  # a Literal's own "none" is a value, not unset
    if value is None or (from_cli and optional and not own and str(value).lower() in ("none", "null")):
        if optional:
            return None
        raise ConfigError(key, describe(tp), value)
    if from_cli and optional and value == "" and base is str:  # `--output_dir "$UNSET"` is not unset
        raise ConfigError(key, "a non-empty value (leave the flag out for its default)", value)
    try:
        if _is_list(base):
            item = _list_item(base)
            if item in (int, float, str):
                values = value if isinstance(value, list) else [value]
                return [_scalar(item, v, from_cli) for v in values]
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
        return _scalar(base, value, from_cli)
    except (ValueError, TypeError):
        instead = FOREIGN_VALUES.get((key, str(value).lower()))
        raise ConfigError(key, describe(tp) + (f" ({instead})" if instead else ""), value) from None


def did_you_mean(value, choices) -> str:
    """' (did you mean 'nano'?)' for a value that differs from a choice by case or a typo, else ''."""
    if not isinstance(value, str):
        return ""
    names = [str(c) for c in choices]
    close = [c for c in names if c.lower() == value.lower()] or difflib.get_close_matches(value, names, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def unknown_key(key: str, known, where: str = "see --help") -> ConfigError:
    """A misspelt config key: one line with yxanul's name for another trainer's key, else the closest one."""
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = yxanul_key_for(key, known) or (f"did you mean '{close[0]}'?" if close else where)
    return ConfigError(key, f"a known config key ({hint})")


def underscored(argv: list[str], names) -> list[str]:
    """``--micro-batch-size`` -> ``--micro_batch_size`` where the underscore spelling is a field (transformers'
    HfArgumentParser takes both): one name in --help and in YAML, either spelling on the command line."""
    out = []
    for a in argv:
        name, eq, value = a[2:].partition("=")
        dashed = a.startswith("--") and "-" in name and name not in names and name.replace("-", "_") in names
        out.append(f"--{name.replace('-', '_')}{eq}{value}" if dashed else a)
    return out


# --------------------------------------------------------------------------- command fields
_UNSET: Any = dataclasses.MISSING


def same_as(section: type, name: str, default: Any = _UNSET) -> Any:
    """A command's field that is the config section's field ``name`` (``--max_lr`` of `yxanul plot-lr` is
    OptimArgs's ``max_lr``): the section's help and default, one place to change them. Annotate it with the
    section's type, or ``X | None`` with ``default=None`` for "the config's value" (the help says so);
    another ``default`` is the command's own (`yxanul plan` plans a 2048-token run).
    The section's check runs on the value where the command builds that section, or at parse time through
    :func:`check_same_as`. :func:`fields_of` refuses a type that is not the section's."""
    f = section.__dataclass_fields__[name]
    meta = dict(f.metadata, same_as=(section, name))
    if default is not _UNSET:
        if default is None:
            meta["help"] = f"{meta.get('help', '')} Unset: the config's value."
        return dataclasses.field(default=default, metadata=meta)
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return dataclasses.field(default_factory=f.default_factory, metadata=meta)  # type: ignore[misc]
    return dataclasses.field(default=f.default, metadata=meta)


def check_same_as(command) -> None:
    """Build each section a command's :func:`same_as` fields come from, with their values (None: the
    config's, left out): the section's own checks, the same one-line errors as `yxanul train`'s."""
    values: dict[type, dict[str, Any]] = {}
    for f in dataclasses.fields(command):
        if "same_as" in f.metadata and getattr(command, f.name) is not None:
            section, name = f.metadata["same_as"]
            values.setdefault(section, {})[name] = getattr(command, f.name)
    for section, kw in values.items():
        section(**kw)


# --------------------------------------------------------------------------- YAML + flags
MERGE_MODES = ("strict", "subset")


def merge(types_: dict[str, Any], yaml_values: dict[str, Any] | None, cli_values: dict[str, Any] | None,
          mode: str = "strict", replaces: dict[str, str] | None = None,
          where: str = "see `yxanul train --help`", others: Collection[str] = ()) -> dict[str, Any]:
    """The one YAML + flags merge: the values given, later wins (YAML file < flags), each checked against
    its field's type (``types_``: key -> type; :func:`coerce`). Defaults are the dataclass's own.

    ``mode="strict"``: a YAML key that is no field is a one-line ConfigError with the closest key.
    ``mode="subset"``: the command reads only these fields of a larger config (a `yxanul train` config given
    to prepare): the file's keys of that config (``others``) are ignored, any other key is the same one-line
    error as in strict mode (a typo must not silently fall back to a default). A flag is always a field
    (argparse refused any other). ``replaces``: flag -> the key in the other unit that it replaces
    (``--warmup_steps`` drops the file's ``warmup_tokens``): a flag set to a value drops the file's value of
    that key."""
    if mode not in MERGE_MODES:
        raise ValueError(f"merge mode {mode!r}: expected one of {MERGE_MODES}")
    merged: dict[str, Any] = {}
    for values, from_cli in ((yaml_values or {}), False), ((cli_values or {}), True):
        for key, value in values.items():
            if key not in types_:
                if mode == "subset" and not from_cli and key in others:
                    continue
                raise unknown_key(key, [*types_, *others], where=where)
            merged[key] = coerce(key, types_[key], value, from_cli=from_cli)
    for flag, other in (replaces or {}).items():
        if (cli_values or {}).get(flag) is not None and other not in (cli_values or {}):
            merged.pop(other, None)
    return merged


# --------------------------------------------------------------------------- the parser
class OneLineParser(argparse.ArgumentParser):
    """argparse that raises a one-line :class:`UserError` instead of printing usage and exiting."""

    def error(self, message):
        raise UserError(f"{self.prog}: {message}")


class GivenOnce(argparse.Action):
    """A flag given twice is one line (``--config a.yaml --config b.yaml`` read b.yaml alone). The parsers'
    ``argument_default=SUPPRESS`` leaves it unset until given."""

    def __call__(self, parser, namespace, values, option_string=None):
        if hasattr(namespace, self.dest):
            raise UserError(f"{parser.prog}: {option_string} given twice ('{getattr(namespace, self.dest)}', then "
                            f"'{values}'): give it once (the last would silently replace the first)")
        setattr(namespace, self.dest, values)


def add_field(parser_or_group, name: str, f: dataclasses.Field, tp, embedded: dict | None = None) -> None:
    """One dataclass field as one argparse argument (values stay strings; :func:`coerce` types them). ``embedded``:
    the command reads the embedded default without --config; its value of this key, if any, is the default shown."""
    base, _ = strip_optional(tp)
    help_ = f.metadata.get("help", "")
    factory = f.default_factory  # type: ignore[misc]
    required = f.default is dataclasses.MISSING and factory is dataclasses.MISSING
    default = None if required else f.default if factory is dataclasses.MISSING else factory()
    if f.metadata.get("positional"):
        kw: dict[str, Any] = {"help": help_, "metavar": f.metadata.get("metavar", name.upper())}
        if _is_list(base):
            kw["nargs"] = "+" if required else "*"
        elif not required:
            kw["nargs"] = "?"
        parser_or_group.add_argument(name, **kw)
        return
    shown = f"default: {default!r}"
    if embedded and name in embedded and embedded[name] != default:
        shown = f"default: {embedded[name]!r} without --config (the embedded default run), {default!r} with one"
    kw = {"help": f"{help_} ({describe(tp)}; {shown})", "dest": name}
    if base is bool:
        kw.update(nargs="?", const="true", metavar="BOOL")
    elif get_origin(base) is Literal:
        kw.update(metavar="{" + ",".join(str(c) for c in get_args(base)) + "}")
    elif _is_list(base) and _list_item(base) in (int, float, str):
        kw.update(nargs="+")
    if f.metadata.get("once"):
        kw.update(action=GivenOnce)
    parser_or_group.add_argument(f"--{name}", *f.metadata.get("aliases", ()), **kw)


def bare_booleans(argv: list[str], bool_flags: set[str]) -> list[str]:
    """``--flag`` followed by something that is not a boolean word means ``--flag=true`` (so a bare
    boolean flag never swallows the next positional argument or flag)."""
    out: list[str] = []
    for i, a in enumerate(argv):
        if a.startswith("--") and "=" not in a and a[2:] in bool_flags:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if nxt is None or nxt.lower() not in _BOOL_WORDS:
                out.append(f"{a}=true")
                continue
        out.append(a)
    return out


def fields_of(cls) -> dict[str, tuple[dataclasses.Field, Any]]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if "same_as" in f.metadata:
            section, name = f.metadata["same_as"]
            theirs = typing.get_type_hints(section)[name]
            if hints[f.name] not in (theirs, theirs | None):
                raise TypeError(f"{cls.__name__}.{f.name}: typed {hints[f.name]}, but the same_as field "
                                f"{section.__name__}.{name} is {theirs} (use that, or it | None)")
    return {f.name: (f, hints[f.name]) for f in dataclasses.fields(cls) if f.init}


def build_parser(cls, prog: str, description: str | None = None) -> OneLineParser:
    parser = OneLineParser(prog=prog, description=description or (cls.__doc__ or "").strip().split("\n\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           argument_default=argparse.SUPPRESS, allow_abbrev=False)
    embedded = embedded_defaults() if getattr(cls, "reads_embedded_default", False) else None
    for name, (f, tp) in fields_of(cls).items():
        add_field(parser, name, f, tp, embedded)
    return parser


def parse_known(parser: argparse.ArgumentParser, argv: list[str], known_flags) -> dict[str, Any]:
    """Parse; a misspelt flag is one line with "did you mean", a stray value one line too."""
    parsed, extra = parser.parse_known_args(argv)
    if extra:
        flag = next((a for a in extra if a.startswith("--")), None)
        if flag is None:
            before = argv[argv.index(extra[0]) - 1] if argv.index(extra[0]) else ""
            if before.startswith("--") and before.endswith("=true"):  # `--use_wandb maybe`: bare_booleans' true
                raise ConfigError(before[2:].split("=", 1)[0], "true or false", extra[0])
            raise UserError(f"{parser.prog}: unexpected argument '{extra[0]}' (flags are --key value)")
        name = flag[2:].split("=", 1)[0]
        if parser.prog == "yxanul train":  # the train flags are config keys, named like the YAML's
            raise unknown_key(name, known_flags, where="see `yxanul train --help`")
        positional = {a.dest: a.metavar or a.dest.upper() for a in parser._actions if not a.option_strings}
        if name in positional:  # `export run --out dir`: say how it is given, not "did you mean '--out'"
            usage = " ".join([parser.prog, *positional.values()])
            raise UserError(f"{parser.prog}: unknown flag '--{name}' ({positional[name]} is positional: {usage})")
        flags = [k for k in known_flags if k not in positional]
        close = difflib.get_close_matches(name, flags, n=1)
        hint = yxanul_key_for(name, flags, advice=False) or (
            f"did you mean '--{close[0]}'?" if close else f"see `{parser.prog} --help`")
        raise UserError(f"{parser.prog}: unknown flag '--{name}' ({hint})")
    return vars(parsed)


def given_flags(argv: list[str] | None) -> set[str]:
    """The flag names present in ``argv`` (``--key value``, ``--key=value``, a bare ``--flag``): what the user chose."""
    return {a[2:].split("=", 1)[0] for a in argv or () if a.startswith("--") and len(a) > 2}


def parse_command(cls: type[T], argv: list[str] | None, prog: str, description: str | None = None) -> T:
    """Parse ``argv`` into an instance of the dataclass ``cls`` (its ``__post_init__`` validates)."""
    return _parse_command(cls, argv, prog, description, keep_rest=False)[0]


def parse_command_and_rest(cls: type[T], argv: list[str] | None, prog: str) -> tuple[T, list[str]]:
    """:func:`parse_command` of the command's own flags; the other arguments are returned for another
    parser (`yxanul find-batch` hands them to `yxanul train`'s)."""
    return _parse_command(cls, argv, prog, None, keep_rest=True)


def _parse_command(cls, argv, prog: str, description: str | None, keep_rest: bool):
    fields = fields_of(cls)
    bools = {n for n, (f, tp) in fields.items() if strip_optional(tp)[0] is bool and not f.metadata.get("positional")}
    parser = build_parser(cls, prog, description)
    argv = bare_booleans(underscored(list(argv or []), fields), bools)
    if keep_rest:
        parsed, rest = parser.parse_known_args(argv)
        ns = vars(parsed)
    else:
        ns, rest = parse_known(parser, argv, [n for n in fields]), []
    values = {k: coerce(k, fields[k][1], v, from_cli=True) for k, v in ns.items()}
    return cls(**values), rest
