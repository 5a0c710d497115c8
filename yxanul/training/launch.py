"""Launch-level checks, run by `yxanul train` (and `accelerate launch train.py`) before anything is
built: what `accelerate launch` exported, whether the machine can run that launch at all, and a W&B
key that would only fail after the first step.

- ``check_launch_environment`` (:mod:`yxanul.lint.launch`, with the linter's own rules): the ACCELERATE_*
  variables and the DeepSpeed file in use. Errors mean: refuse.
- ``check_wandb_key(use_wandb, env=os.environ)`` -> a problem string or None (format check, offline).
- ``check_process_env(env)``: the launcher's process-group variables, whole numbers and a MASTER_ADDR.
- ``preflight(cfg, say)``: both, raising a one-line UserError on an error, printing warnings.
"""

from __future__ import annotations

import os

from ..errors import ConfigError, UserError
from ..lint import ERROR, check_launch_environment, process_env_problem
from ..lint.fsdp import launch_engine, train_conflicts


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


def check_process_env(env=None) -> None:
    """The process-group variables a launcher exports (WORLD_SIZE, RANK, MASTER_ADDR, ...), before the speed
    defaults or accelerate read them: a one-line UserError (`yxanul.lint.launch.process_env_problem`)."""
    problem = process_env_problem(env)
    if problem:
        raise UserError(problem)


def preflight(cfg, say=print, env=None, cuda_available: bool | None = None) -> None:
    """Launch checks before anything is built: errors raise a one-line UserError, warnings are said."""
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    problem = check_wandb_key(cfg.tracking.use_wandb, env)
    if problem:
        raise UserError(problem)
    if cfg.hub.hub_model_id and not cfg.hub.push_to_hub:  # a repository named, a push forgotten
        say(f"note: hub_model_id {cfg.hub.hub_model_id} is set but push_to_hub is false: nothing is pushed while "
            "this run trains (--push_to_hub pushes; `yxanul push RUN` pushes an ended run)")
    train = {"cuda_graphs": cfg.model.cuda_graphs, "master_weights": cfg.precision.master_weights,
             "fp8_weight_all_gather": cfg.precision.fp8_weight_all_gather, "fuse_qkv_rope": cfg.model.fuse_qkv_rope}
    env = os.environ if env is None else env
    engine, processes = launch_engine(env), int(env.get("WORLD_SIZE") or 1)  # a number: check_process_env ran
    for key, expected in train_conflicts(engine == "fsdp2", train, deepspeed=engine == "deepspeed",
                                         processes=processes):
        raise ConfigError(key, expected, train[key])
    for p in check_launch_environment(env, use_fp8=cfg.precision.use_fp8, cuda_available=cuda_available):
        if p.severity == ERROR:
            raise UserError(p.said())
        say(f"warning: {p.said()}")
