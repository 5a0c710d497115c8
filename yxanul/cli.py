"""`yxanul <command>`: one entry point; each command lives in the module that owns it."""

from __future__ import annotations

import importlib
import os
import sys

# command -> (module, function, one-line help)
COMMANDS = {
    "train": ("yxanul.cli", "train_main", "pretrain a model (default: the embedded demo config)"),
    "prepare": ("yxanul.data.prepare", "main", "tokenize and pack a dataset into token shards"),
    "checkpoints": ("yxanul.checkpoint", "main", "list the checkpoints of a run directory"),
    "verify": ("yxanul.tools.verify", "main", "check the FP8 stack (GPU, CUDA, TE, accelerate)"),
    "lint-config": ("yxanul.lint", "main", "lint DeepSpeed JSON / accelerate YAML configs (--fix)"),
    "find-batch": ("yxanul.batching.finder", "main", "find the largest micro-batch that fits"),
    "plot-lr": ("yxanul.tools.plot_lr", "main", "plot the learning-rate schedule to a PNG"),
    "bench": ("yxanul.tools.bench", "main", "measure training throughput, MFU and memory per preset and precision"),
    "compare": ("yxanul.tools.compare", "main", "plot and compare the loss curves of runs (e.g. BF16 vs FP8)"),
}

DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), "assets", "default.yaml")


def train_main(argv: list[str] | None = None) -> int:
    """`yxanul train [--config FILE] [--flag value ...]` and `accelerate launch train.py ...`."""
    from .config import parse_args

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--config" not in argv and not any(a.startswith("--config=") for a in argv) \
            and not {"-h", "--help"} & set(argv):
        argv = ["--config", DEFAULT_CONFIG, *argv]
    cfg = parse_args(argv)
    if cfg.checkpoint.list_checkpoints:
        from .checkpoint import format_table, run_dir_of

        print(format_table(run_dir_of(cfg)))
        return 0
    from .training import train

    train(cfg)
    return 0


def _usage() -> str:
    lines = ["usage: yxanul <command> [args]", "", "commands:"]
    lines += [f"  {name:<12} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += ["", "`yxanul <command> --help` for the flags of a command."]
    return "\n".join(lines)


def run(func, argv) -> int:
    """Call a command; a UserError becomes one line on stderr and exit code 2."""
    from .errors import UserError

    try:
        return int(func(argv) or 0)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from . import __version__

        print(f"yxanul {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command '{name}' (expected one of: {', '.join(COMMANDS)})", file=sys.stderr)
        return 2
    module, func, _ = COMMANDS[name]
    return run(getattr(importlib.import_module(module), func), rest)


if __name__ == "__main__":
    sys.exit(main())
