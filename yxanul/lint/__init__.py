"""`yxanul lint-config` and the training start-up check: what DeepSpeed 0.19 and accelerate 1.15 really read.

Every rule table was read from the sources (tests/lint/test_lint.py compares them with the installed
packages where those are importable):
- DeepSpeed: runtime/config.py `_REMOVED_TOP_LEVEL_CONFIG_KEYS` / `_REMOVED_ZERO_CONFIG_KEYS`
  (raise DeepSpeedConfigError), pydantic models with extra="forbid": runtime/precision_config.py
  (bf16, fp16), runtime/zero/config.py, runtime/zero/offload_config.py.
- accelerate: commands/config/config_args.py `ClusterConfig` (unknown top-level key -> ValueError),
  commands/launch.py (fp8_config keys -> ACCELERATE_FP8_<KEY>), utils/dataclasses.py (readers of
  those env vars), accelerator.py `_prepare_deepspeed` (the "auto" values it fills).

Modules: common.py (Problem, the one truthy helper, dict helpers), deepspeed.py and accelerate.py (the
rules; the FP8-key and use_fp8 rules live once in accelerate.py and serve both the YAML and the launch
environment), files.py (load, detect, lint_file, fix_config, sanitize_deepspeed_config, the command;
`yxanul lint-config` runs it from tools/lint_config.py, which validates --train_config as train does),
launch.py (check_launch_environment: what `accelerate launch` exported).
Policy (docs/distributed.md): severity "error" = the run would fail or silently train wrong ->
refuse to start; "warning" = wasteful or ignored -> sanitized / reported, the run goes on.
"""

from .common import ERROR, WARNING, Problem
from .files import detect_kind, fix_config, lint_file, main, sanitize_deepspeed_config
from .launch import check_launch_environment, process_env_problem

__all__ = ["ERROR", "WARNING", "Problem", "check_launch_environment", "detect_kind", "fix_config", "lint_file",
           "main", "process_env_problem", "sanitize_deepspeed_config"]
