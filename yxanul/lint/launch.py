"""The start-up check: what `accelerate launch` exported (ACCELERATE_*), with the same rules as the
YAML linter (:mod:`.accelerate`) and the DeepSpeed file in use linted by :func:`.files.lint_file`."""

from __future__ import annotations

import os

from .accelerate import fp8_key_problem, precision_mismatch
from .common import ERROR, WARNING, Problem, collector, truthy
from .files import lint_file
from .fsdp import lint_fsdp_env

# what `accelerate launch` exports for every FP8 launch whatever the YAML says (its --fp8_* argparse defaults,
# utils/launch.py setup_fp8_env): not the user's setting, so not theirs to remove
LAUNCH_EXPORTS = {"ACCELERATE_FP8_INTERVAL": "1"}


def _int(value, default: int | None) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


PROCESS_INTS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT")


def process_env_problem(env=None) -> str | None:
    """The process-group variables a launcher exports, as torch's ``env://`` rendezvous reads them: whole numbers,
    and with WORLD_SIZE > 1 a MASTER_ADDR to meet at (a WORLD_SIZE left in a shell, with no launcher, was
    accelerate's multi-line ValueError). One line, or None."""
    env = os.environ if env is None else env
    for key in PROCESS_INTS:
        if key in env and _int(env[key], None) is None:
            return f"{key}={env[key]!r} in the environment: expected a whole number (as a launcher exports it)"
    if _int(env.get("WORLD_SIZE", "1"), 1) > 1 and not env.get("MASTER_ADDR"):
        return (f"WORLD_SIZE={env['WORLD_SIZE']} in the environment but no MASTER_ADDR: start several processes "
                "with `yxanul launch` (or accelerate launch / torchrun), or unset WORLD_SIZE for one")
    return None


def _deepspeed_problems(env, add, use_fp8) -> list[Problem]:
    # several DeepSpeed processes without CUDA are fine: DeepSpeed's CPU accelerator joins them over gloo
    # and the trainer tells accelerate so (training/runtime.py process_state; tests/training/test_deepspeed.py)
    fields = [f for f in env.get("ACCELERATE_CONFIG_DS_FIELDS", "").split(",") if f]
    path = env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if not path or path == "none":
        return []
    if "mixed_precision" in fields:
        add("ACCELERATE_CONFIG_DS_FIELDS", ERROR, "mixed_precision came from the accelerate YAML together with a "
            "deepspeed_config_file: accelerate raises ValueError",
            "remove mixed_precision from the YAML (yxanul sets it)")
    if not os.path.isfile(path):
        add("ACCELERATE_DEEPSPEED_CONFIG_FILE", ERROR, f"{path} not found from {os.getcwd()}",
            "launch from the repository root or use an absolute path")
        return []
    return lint_file(path, world_size=_int(env.get("WORLD_SIZE"), 0) or None, use_fp8=use_fp8)


def check_launch_environment(env=None, *, use_fp8: bool | None = None, cuda_available: bool | None = None,
                             forces_cpu: bool = True) -> list[Problem]:
    """``use_fp8``: the yxanul config's decision (None: not compared). ``cuda_available``: pass
    ``torch.cuda.is_available()`` (None: not checked). ``forces_cpu``: the caller builds its state with
    ``cpu=True`` on a machine without CUDA (yxanul's trainer does, except under DeepSpeed), so torchrun'd
    ranks really are "rank r of W"; only other callers get the 'rank 0 of 1' warning. Errors mean: refuse."""
    env = os.environ if env is None else env
    P, add = collector("environment")
    for key in sorted(k for k in env if k.startswith("ACCELERATE_FP8_")):
        if env[key] == LAUNCH_EXPORTS.get(key):  # `accelerate launch` exports it for every FP8 launch
            continue
        found = fp8_key_problem(key[len("ACCELERATE_FP8_"):].lower())
        if found:
            add(key, WARNING, *found)
    backend = env.get("ACCELERATE_FP8_BACKEND")
    if backend is not None and backend != backend.upper():
        add("ACCELERATE_FP8_BACKEND", WARNING, f"{backend!r}: FP8BackendType({backend!r}) raises "
            "in a plain accelerate script; yxanul passes its TE recipe itself, so it goes on",
            "fp8_config: {backend: TE} (upper case) in the accelerate YAML")
    mp = env.get("ACCELERATE_MIXED_PRECISION")
    deepspeed = truthy(env.get("ACCELERATE_USE_DEEPSPEED"))
    if mp and not (deepspeed and mp == "no"):
        found = precision_mismatch(mp, use_fp8, source="accelerate launch")
        if found:
            add("ACCELERATE_MIXED_PRECISION", WARNING, *found)
    if deepspeed:
        P.extend(_deepspeed_problems(env, add, use_fp8))
        if truthy(env.get("ACCELERATE_USE_CPU")):  # e.g. left exported for cpu.yaml, as docs/distributed.md shows
            add("ACCELERATE_USE_CPU", ERROR, "set under DeepSpeed: accelerate then makes no DeepSpeed plugin and "
                "Accelerator() fails on every rank (AttributeError: no attribute 'mixed_precision'); DeepSpeed finds "
                "the CPU by itself", "unset ACCELERATE_USE_CPU for a DeepSpeed launch")
    if truthy(env.get("ACCELERATE_USE_FSDP")):  # on CPU too: the trainer shards over gloo (training/fsdp.py)
        lint_fsdp_env(env, use_fp8, add)
    world = _int(env.get("WORLD_SIZE", "1"), 1)
    if cuda_available is False and world > 1 and "LOCAL_RANK" in env and not truthy(env.get("ACCELERATE_USE_CPU")) \
            and not (deepspeed or forces_cpu):
        add("ACCELERATE_USE_CPU", WARNING, f"{world} processes, no CUDA and ACCELERATE_USE_CPU "
            "unset: accelerate makes each process 'rank 0 of 1' unless Accelerator(cpu=True)",
            "launch with ACCELERATE_USE_CPU=1 (accelerate_configs/cpu.yaml)")
    return P
