"""`yxanul prepare`: the data layer's `prepare` as a command. It lives here, above `yxanul.config`, because a
``--config`` may be a whole training config: its data keys are read, its other training keys ignored, and
any key of no config (a typo such as ``datsets``) is one line, exit 2, instead of preparing the default
corpus."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import ClassVar

from ..config import config_keys
from ..config_file import load_yaml, with_default_config
from ..data.args import DataArgs
from ..data.prepare import prepare, read_meta
from ..flags import fields_of, merge, parse_command


@dataclass
class PrepareCommand(DataArgs):
    """Tokenize and pack a dataset into token shards (docs/data.md)."""

    reads_embedded_default: ClassVar[bool] = True  # without --config: `yxanul train`'s data keys (its --help says)

    config: str | None = field(default=None, metadata={"once": True, "help": "YAML config; only its data keys are "
                                                                              "used (e.g. a 'datasets' mixture); flags "
                                                                              "override it."})


def parse_prepare_args(argv: list[str] | None) -> DataArgs:
    """Flags (yxanul.flags.parse_command) over the data keys of ``--config``; its other keys must be keys of a
    training config (ignored), any other is a one-line error."""
    argv = list(argv or [])
    cli = parse_command(PrepareCommand, argv, prog="yxanul prepare")
    data_fields = fields_of(DataArgs)
    given = {k for k in data_fields for a in argv if a == f"--{k}" or a.startswith(f"--{k}=")}
    # only the data keys of the file: a training config can be prepared ahead of `yxanul train`
    values = merge({k: tp for k, (_, tp) in data_fields.items()}, load_yaml(cli.config) if cli.config else {},
                   {k: getattr(cli, k) for k in given}, mode="subset", replaces={"dataset": "datasets"},
                   others=config_keys())
    return DataArgs(**values)


def main(argv: list[str] | None = None) -> int:
    """`yxanul prepare [--config FILE] [--dataset ...] [--tokenizer ...] [--data_dir ...]`: without --config, the
    data keys of the embedded default, as `yxanul train` reads them: it prepares the shards `yxanul train` reads."""
    out = prepare(parse_prepare_args(with_default_config(list(sys.argv[1:] if argv is None else argv))))
    meta = read_meta(out)
    print(json.dumps({k: meta[k] for k in ("tokenizer", "vocab_size", "eos_token_id", "dtype")} |
                     {s: {k: v for k, v in d.items() if k not in ("shards", "manifest")}
                      for s, d in meta["splits"].items()} | {"mixture": meta["mixture"]}))
    return 0
