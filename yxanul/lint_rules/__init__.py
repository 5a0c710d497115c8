"""Rules of `yxanul lint-config`: what DeepSpeed 0.19 and accelerate 1.15 really read.

Every list below was read from the sources (tests/test_lint.py compares them with the installed
packages where those are importable):
- DeepSpeed: runtime/config.py `_REMOVED_TOP_LEVEL_CONFIG_KEYS` / `_REMOVED_ZERO_CONFIG_KEYS`
  (raise DeepSpeedConfigError), pydantic models with extra="forbid": runtime/precision_config.py
  (bf16, fp16), runtime/zero/config.py, runtime/zero/offload_config.py.
- accelerate: commands/config/config_args.py `ClusterConfig` (unknown top-level key -> ValueError),
  commands/launch.py (fp8_config keys -> ACCELERATE_FP8_<KEY>), utils/dataclasses.py (readers of
  those env vars), accelerator.py `_prepare_deepspeed` (the "auto" values it fills).
Files: common.py (Problem, dict helpers), deepspeed.py, accelerate.py. Each rule yields `Problem`s; `fix` rules mutate a copy (used by `yxanul lint-config --fix`).
"""

from .accelerate import (ACC_KEYS, DISTRIBUTED_TYPES, DS_FILE_CONFLICTS, DS_YAML_KEYS, FP8_BACKENDS, FP8_DEAD_KEYS,
                         FP8_READ_KEYS, FP8_TE_DROPPED, MIXED_PRECISIONS, fix_accelerate, lint_accelerate)
from .common import ERROR, WARNING, Problem, _delete, _get
from .deepspeed import (DS_AUTO_FILLED, DS_BF16_KEYS, DS_FP16_KEYS, DS_OFFLOAD_OPTIMIZER_KEYS, DS_OFFLOAD_PARAM_KEYS,
                        DS_REMOVED_TOP, DS_REMOVED_ZERO, DS_ZERO_KEYS, STRICT_BLOCKS, fix_deepspeed, harmful_ds_keys,
                        lint_deepspeed)

__all__ = ["ACC_KEYS", "DISTRIBUTED_TYPES", "DS_AUTO_FILLED", "DS_BF16_KEYS", "DS_FILE_CONFLICTS", "DS_FP16_KEYS",
           "DS_OFFLOAD_OPTIMIZER_KEYS", "DS_OFFLOAD_PARAM_KEYS", "DS_REMOVED_TOP", "DS_REMOVED_ZERO", "DS_YAML_KEYS",
           "DS_ZERO_KEYS", "ERROR", "FP8_BACKENDS", "FP8_DEAD_KEYS", "FP8_READ_KEYS", "FP8_TE_DROPPED",
           "MIXED_PRECISIONS", "Problem", "STRICT_BLOCKS", "WARNING", "_delete", "_get", "fix_accelerate",
           "fix_deepspeed", "harmful_ds_keys", "lint_accelerate", "lint_deepspeed"]
