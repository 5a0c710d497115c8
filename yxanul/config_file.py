"""A config file: flat ``key: value`` YAML read strictly (a key given twice, an empty file, a non-mapping: one
line each), and the embedded default run that `yxanul train` and the commands resolving its run start from."""

from __future__ import annotations

import functools
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml

from .errors import UserError

DEFAULT_CONFIG = str(Path(__file__).parent / "assets" / "default.yaml")  # the embedded default run


@functools.cache
def embedded_defaults() -> dict[str, Any]:
    """The embedded default run's values: what a command that reads it without --config (`with_default_config`)
    starts from, so its --help says them instead of the dataclass defaults a --config FILE starts from."""
    return load_yaml(DEFAULT_CONFIG)


def with_default_config(argv: list[str]) -> list[str]:
    """``argv`` with ``--config DEFAULT_CONFIG`` first unless it names a config (or asks for help): the run
    `yxanul train` resolves, which find-batch, plot-lr, sweep trials and prepare (its data keys) resolve too."""
    if "--config" in argv or any(a.startswith("--config=") for a in argv) or {"-h", "--help"} & set(argv):
        return argv
    return ["--config", DEFAULT_CONFIG, *argv]


_MERGE_TAG = "tag:yaml.org,2002:merge"  # `<<: *base`: the keys of another mapping (SafeLoader merges them)


def _what(key) -> str:
    """A key that YAML did not read as a string, as YAML read it: 'the boolean true' (YAML 1.1's on, yes)."""
    if key is None:
        return "null"
    if isinstance(key, bool):
        return f"the boolean {str(key).lower()}"
    return f"the {'integer' if isinstance(key, int) else type(key).__name__} {key}"


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last) and a key that is
    not a string (``5:``, YAML 1.1's ``on:``/``no:``, ``null:``: no key is named so). A merge (``<<: *base``)
    is no key of the mapping: its keys are the base's, which the mapping's own keys override."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if not isinstance(key, str):
                if not isinstance(key, Hashable):  # a list or mapping as key: the loader's own "unhashable key"
                    continue
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key_node.value}' is read by YAML as {_what(key)}, not a name (keys are "
                                "names such as max_steps)", key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' given twice (lines {seen[key]} and {line}; the last would win silently)",
                    key_node.start_mark)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: str) -> dict[str, Any]:
    """A flat ``key: value`` YAML file; an empty file, a key given twice or a non-mapping is one line."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"config file '{path}': " + ("a folder, not a YAML file" if p.is_dir() else "no such file"))
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
