"""Config files: load, tell DeepSpeed from accelerate, lint, fix, and the `yxanul lint-config` command."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field

import yaml

from ..config_file import load_yaml
from ..errors import ConfigError, UserError
from ..flags import parse_command
from .accelerate import fix_accelerate, lint_accelerate
from .common import ERROR, WARNING, Problem, _delete
from .deepspeed import fix_deepspeed, harmful_ds_keys, lint_deepspeed
from .fsdp import train_conflicts

_ACC_MARKERS = {"distributed_type", "compute_environment", "num_processes", "mixed_precision",
                "fp8_config", "deepspeed_config"}
# keys only a yxanul training config has (examples/configs/*.yaml): one passed as a launch config is a mix-up
_YXANUL_MARKERS = {"model", "max_steps", "max_lr", "micro_batch_size", "seq_length", "use_fp8", "dataset", "datasets",
                   "curriculum", "warmup_steps", "data_dir", "fp8_recipe"}
_DS_MARKERS = {"zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size", "bf16",
               "fp16", "gradient_accumulation_steps", "optimizer"}


def _load(path: str):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".json"):
        return json.loads(text)
    return yaml.safe_load(text)


def detect_kind(path: str, data) -> str:
    """'deepspeed' | 'accelerate' | 'unknown' (by content, the extension breaks ties)."""
    keys = set(data) if isinstance(data, dict) else set()
    if keys & {"distributed_type", "compute_environment"}:
        return "accelerate"
    if keys & {"zero_optimization", "train_micro_batch_size_per_gpu"}:
        return "deepspeed"
    if keys & _YXANUL_MARKERS and not path.endswith(".json"):  # before the weak markers: it has
        return "yxanul"                                            # gradient_accumulation_steps too
    if keys & _ACC_MARKERS and not path.endswith(".json"):
        return "accelerate"
    if keys & _DS_MARKERS or path.endswith(".json"):
        return "deepspeed"
    return "unknown"


def _ds_file_resolver(config_path: str):
    base = os.path.dirname(os.path.abspath(config_path))

    def exists(p: str) -> bool:
        return any(os.path.isfile(os.path.join(d, p)) for d in ("", os.getcwd(), base,
                                                                  os.path.dirname(base)))
    return exists


def lint_file(path: str, *, use_fp8: bool | None = None,
              world_size: int | None = None) -> list[Problem]:
    try:
        data = _load(path)
    except FileNotFoundError:
        return [Problem(path, "<file>", ERROR, "file not found", "check the path")]
    except (ValueError, yaml.YAMLError) as e:
        msg = " ".join(str(e).split())[:200]
        return [Problem(path, "<file>", ERROR, f"does not parse: {msg}", "fix the syntax")]
    kind = detect_kind(path, data)
    if kind == "deepspeed":
        return lint_deepspeed(data, path, world_size=world_size, use_fp8=use_fp8)
    if kind == "accelerate":
        return lint_accelerate(data, path, use_fp8=use_fp8,
                               ds_file_exists=_ds_file_resolver(path))
    if kind == "yxanul":
        return [Problem(path, "<file>", ERROR, "a yxanul training config, not a DeepSpeed or accelerate one",
                        f"pass it as --train_config {path} beside the accelerate config it runs with")]
    return [Problem(path, "<file>", ERROR, "neither a DeepSpeed config (zero_optimization, "
                    "train_micro_batch_size_per_gpu) nor an accelerate config (distributed_type)",
                    "pass a DeepSpeed JSON or an accelerate YAML")]


def fix_config(path: str, out_path: str) -> list[Problem]:
    """Write a corrected copy of ``path`` to ``out_path``; returns the problems found in ``path``."""
    problems = lint_file(path)
    data = _load(path)
    kind = detect_kind(path, data)
    if kind == "deepspeed":
        fixed = fix_deepspeed(data)
    elif kind == "accelerate":
        fixed = fix_accelerate(data)
    else:
        raise ValueError(f"{path}: not a DeepSpeed or accelerate config")
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "w", encoding="utf-8") as f:
        if out_path.endswith(".json"):
            json.dump(fixed, f, indent=2)
            f.write("\n")
        else:
            yaml.safe_dump(fixed, f, sort_keys=False)
    return problems


def sanitize_deepspeed_config(cfg: dict, source: str = "<deepspeed config>"
                              ) -> tuple[dict, list[Problem]]:
    """Copy of ``cfg`` without the keys DeepSpeed accepts but that only cost time; one warning
    per removed key. Errors (removed/unknown keys, fp16, optimizer blocks) are left for
    ``lint_deepspeed``: the trainer refuses to start on those."""
    import copy

    out = copy.deepcopy(cfg)
    problems = []
    for key, reason, _ in harmful_ds_keys(cfg):
        _delete(out, key)
        problems.append(Problem(source, key, WARNING, reason, "removed for this run (sanitized)"))
    if out.get("data_types") == {}:
        del out["data_types"]
    return out, problems


def _read_train(path: str, validate=None) -> dict:
    """The train config's values, read by the loader `yxanul train --config` reads with; ``validate(values,
    path)``: what train checks of them (`yxanul.tools.lint_config`: the config lies above the linter)."""
    try:
        data = load_yaml(path)
    except UserError as e:  # names the file already
        raise UserError(f"train_config: {e}") from None
    if validate is not None:
        try:
            validate(data, path)
        except UserError as e:
            raise UserError(f"train_config '{path}': {e}") from None
    return data


def train_problems(path: str, train_path: str, train: dict) -> list[Problem]:
    """The train config's settings that the accelerate config ``path`` cannot run (`fsdp.train_conflicts`:
    what the start-up check refuses), as errors of the train config."""
    data = _load(path)
    if detect_kind(path, data) != "accelerate":
        return []
    kind = str(data.get("distributed_type", ""))
    processes = data.get("num_processes") if isinstance(data.get("num_processes"), int) else 1
    return [Problem(train_path, key, ERROR, f"expected {expected} (with {os.path.basename(path)}), got "
                    f"{train[key]!r}", f"change {key} or the accelerate config")
            for key, expected in train_conflicts(kind == "FSDP", train, deepspeed=kind == "DEEPSPEED",
                                                 processes=processes)]


@dataclass
class LintCommand:
    """Lint DeepSpeed JSON and accelerate YAML configs; exit 1 if any error (2 with --strict and warnings)."""

    files: list[str] = field(metadata={"positional": True, "metavar": "FILE",
                                       "help": "DeepSpeed JSON / accelerate YAML files"})
    fix: bool = field(default=False, metadata={"help": "Write corrected copies (never in place)."})
    out: str | None = field(default=None, metadata={"help": "Directory for --fix output (default: next to each "
                                                    "file as NAME.fixed.EXT)."})
    train_config: str | None = field(default=None, metadata={"aliases": ["--train-config"], "help": "yxanul config "
                                     "YAML, validated as `yxanul train --config` does (what train refuses: one line, "
                                     "exit 2); warn when its use_fp8 disagrees with the accelerate config's "
                                     "mixed_precision; an error for what the launch cannot run (FSDP2: "
                                     "cuda_graphs, master_weights fp32; fp8_weight_all_gather outside it)."})
    world_size: int | None = field(default=None, metadata={"aliases": ["--world-size"], "help": "Check "
                                   "train_batch_size = micro x accumulation x world size."})
    strict: bool = field(default=False, metadata={"help": "For CI gates: exit 2 when there are warnings (and no "
                                                          "errors, which exit 1 anyway)."})

    def __post_init__(self):  # what is not a config to lint is a usage error (exit 2), not a finding (exit 1)
        for path in self.files:
            if not os.path.isfile(path):
                raise UserError(f"lint-config: '{path}': " + ("a folder, not a config file" if os.path.isdir(path)
                                                               else "no such file"))
            _readable_config(path)
        if self.world_size is not None and self.world_size < 1:
            raise ConfigError("world_size", "an integer >= 1", self.world_size)


def _readable_config(path: str) -> None:
    """A file that does not parse, is empty or is not a mapping has no keys to lint: a usage error (one line,
    exit 2), where a parsed config's findings exit 1."""
    expected = "a DeepSpeed JSON object or an accelerate YAML mapping of key: value"
    with open(path, "rb") as f:
        if not f.read().strip():
            raise UserError(f"lint-config: '{path}': empty; expected {expected}")
    try:
        data = _load(path)
    except (ValueError, yaml.YAMLError) as e:  # UnicodeDecodeError is a ValueError
        raise UserError(f"lint-config: '{path}': does not parse ({' '.join(str(e).split())[:200]}); expected "
                        f"{expected}") from None
    if data is None:  # only comments
        raise UserError(f"lint-config: '{path}': empty; expected {expected}")
    if not isinstance(data, dict):
        raise UserError(f"lint-config: '{path}': expected {expected}, got a {type(data).__name__}")


def _fix_one(path: str, args: LintCommand, use_fp8) -> None:
    stem, ext = os.path.splitext(os.path.basename(path))
    out = os.path.join(args.out, stem + ext) if args.out else os.path.join(os.path.dirname(path), f"{stem}.fixed{ext}")
    if os.path.abspath(out) == os.path.abspath(path):
        raise UserError(f"{path}: not overwriting the input; choose another --out")
    fix_config(path, out)
    left = lint_file(out, use_fp8=use_fp8, world_size=args.world_size)
    print(f"{path}: fixed copy written to {out} ({len(left)} problem(s) left)")


def main(argv: list[str] | None = None, validate_train=None) -> int:
    """`yxanul lint-config FILE... [--fix] [--out DIR] [--train_config FILE] [--world_size N] [--strict]`;
    ``validate_train(values, path)`` raises what `yxanul train` refuses in the train config (the command passes
    `config.resolve`)."""
    args = parse_command(LintCommand, argv, prog="yxanul lint-config")
    train = _read_train(args.train_config, validate_train) if args.train_config else {}
    use_fp8 = bool(train.get("use_fp8", False)) if args.train_config else None
    n_err = n_warn = 0
    for path in args.files:
        problems = lint_file(path, use_fp8=use_fp8, world_size=args.world_size)
        if args.train_config and os.path.isfile(path) and not any(p.key == "<file>" for p in problems):
            problems += train_problems(path, args.train_config, train)
        for p in problems:
            print(p.line())
        n_err += sum(p.severity == ERROR for p in problems)
        n_warn += sum(p.severity == WARNING for p in problems)
        if not problems:
            print(f"{path}: ok")
        if args.fix and not any(p.key in ("<file>", "<root>") for p in problems):  # no config to correct
            _fix_one(path, args, use_fp8)
        elif args.fix:
            print(f"{path}: no fixed copy (not a config mapping to correct)")
    print(f"{len(args.files)} file(s): {n_err} error(s), {n_warn} warning(s)"
          + (" (--strict: warnings fail)" if args.strict and n_warn and not n_err else ""))
    return 1 if n_err else (EXIT_STRICT_WARNINGS if args.strict and n_warn else 0)


EXIT_STRICT_WARNINGS = 2


if __name__ == "__main__":
    sys.exit(main())
