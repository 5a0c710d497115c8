"""Launch-level checks, run by `yxanul train` (and `accelerate launch train.py`) before anything is
built: what `accelerate launch` exported, whether the machine can run that launch at all, and a W&B
key that would only fail after the first step.

- ``check_launch_environment(env=os.environ, *, use_fp8=None, cuda_available=None, forces_cpu=True)``
  -> list[Problem]: the ACCELERATE_* variables and the DeepSpeed file in use. Errors mean: refuse.
- ``check_wandb_key(use_wandb, env=os.environ)`` -> a problem string or None (format check, offline).
- ``preflight(cfg, say)``: both, raising a one-line UserError on an error, printing warnings.
"""

from __future__ import annotations

import os

from .errors import UserError
from .lint_rules import ERROR, FP8_DEAD_KEYS, FP8_READ_KEYS, WARNING, Problem


def _truthy(v: str | None) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "on")


def _fp8_env(env, add) -> None:
    for key in sorted(env):
        if not key.startswith("ACCELERATE_FP8_"):
            continue
        name = key[len("ACCELERATE_FP8_"):].lower()
        if name in FP8_DEAD_KEYS:
            add(key, WARNING, "read by nothing (the `accelerate config` questionnaire's name)",
                f"use fp8_config.{FP8_DEAD_KEYS[name]} (ACCELERATE_FP8_{FP8_DEAD_KEYS[name].upper()})")
        elif name not in FP8_READ_KEYS and not name.startswith("override_"):
            add(key, WARNING, "read by nothing", "remove it from fp8_config")
    backend = env.get("ACCELERATE_FP8_BACKEND")
    if backend is not None and backend != backend.upper():
        add("ACCELERATE_FP8_BACKEND", WARNING, f"{backend!r}: FP8BackendType({backend!r}) raises "
            "in a plain accelerate script; yxanul passes its TE recipe itself, so it goes on",
            "fp8_config: {backend: TE} (upper case) in the accelerate YAML")


def _deepspeed_env(env, add, problems: list, cuda_available) -> None:
    from .lint import lint_file

    if cuda_available is False:
        add("ACCELERATE_USE_DEEPSPEED", ERROR, "DeepSpeed was launched but this machine has no CUDA GPU "
            "(every rank would fail in DeepSpeed's accelerator check)",
            "on CPU launch with accelerate_configs/cpu.yaml, or run on a GPU machine")
    fields = [f for f in env.get("ACCELERATE_CONFIG_DS_FIELDS", "").split(",") if f]
    path = env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if not path or path == "none":
        return
    if "mixed_precision" in fields:
        add("ACCELERATE_CONFIG_DS_FIELDS", ERROR, "mixed_precision came from the accelerate YAML together "
            "with a deepspeed_config_file: accelerate raises ValueError", "remove mixed_precision from the YAML "
            "(yxanul sets it)")
    if not os.path.isfile(path):
        add("ACCELERATE_DEEPSPEED_CONFIG_FILE", ERROR, f"{path} not found from {os.getcwd()}",
            "launch from the repository root or use an absolute path")
        return
    try:
        world = int(env.get("WORLD_SIZE", "0")) or None
    except ValueError:
        world = None
    problems.extend(lint_file(path, world_size=world))


def check_launch_environment(env=None, *, use_fp8: bool | None = None, cuda_available: bool | None = None,
                             forces_cpu: bool = True) -> list[Problem]:
    """What training checks at start: the ACCELERATE_* variables `accelerate launch` exported.

    ``use_fp8``: the yxanul config's decision (None: not compared). ``cuda_available``: pass
    ``torch.cuda.is_available()`` (None: not checked). ``forces_cpu``: the caller builds its state
    with ``cpu=True`` on a machine without CUDA (yxanul's trainer does, except under DeepSpeed), so
    torchrun'd ranks really are "rank r of W"; only other callers get the 'rank 0 of 1' warning."""
    env = os.environ if env is None else env
    problems: list[Problem] = []

    def add(key, sev, msg, fix):
        problems.append(Problem("environment", key, sev, msg, fix))

    _fp8_env(env, add)
    mp = env.get("ACCELERATE_MIXED_PRECISION")
    deepspeed = _truthy(env.get("ACCELERATE_USE_DEEPSPEED"))
    if use_fp8 is not None and mp and not (deepspeed and mp == "no") and (mp == "fp8") != use_fp8:
        add("ACCELERATE_MIXED_PRECISION", WARNING, f"accelerate launch says {mp}, the yxanul config says "
            f"use_fp8: {str(use_fp8).lower()}; yxanul's setting is used",
            "make the accelerate YAML and the yxanul config agree")
    if deepspeed:
        _deepspeed_env(env, add, problems, cuda_available)
    try:
        world = int(env.get("WORLD_SIZE", "1"))
    except ValueError:
        world = 1
    if cuda_available is False and world > 1 and "LOCAL_RANK" in env and not _truthy(env.get("ACCELERATE_USE_CPU")) \
            and (deepspeed or not forces_cpu):
        add("ACCELERATE_USE_CPU", WARNING, f"{world} processes, no CUDA and ACCELERATE_USE_CPU unset: accelerate "
            "makes each process 'rank 0 of 1' unless Accelerator(cpu=True)",
            "launch with ACCELERATE_USE_CPU=1 (accelerate_configs/cpu.yaml)")
    return problems


def check_wandb_key(use_wandb: bool, env=None) -> str | None:
    """A W&B API key in the environment that W&B would refuse, checked with W&B's own format check
    (no network): before training, not after the first step. None: fine, offline, or no key."""
    env = os.environ if env is None else env
    key = env.get("WANDB_API_KEY")
    if not use_wandb or key is None or env.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun"):
        return None
    try:
        from wandb.sdk.lib.wbauth.validation import check_api_key
    except ImportError:  # another wandb version: its own login reports it
        return None
    problem = check_api_key(key.strip()) if key.strip() == key else "API key starts or ends with whitespace."
    return f"WANDB_API_KEY: {problem.rstrip('.')} (set a valid key, or WANDB_MODE=offline)" if problem else None


def preflight(cfg, say=print, env=None, cuda_available: bool | None = None) -> None:
    """Launch checks before anything is built: errors raise a one-line UserError, warnings are said."""
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    problem = check_wandb_key(cfg.tracking.use_wandb, env)
    if problem:
        raise UserError(problem)
    for p in check_launch_environment(env, use_fp8=cfg.precision.use_fp8, cuda_available=cuda_available):
        if p.severity == ERROR:
            raise UserError(p.line())
        say(f"warning: {p.line()}")
