"""accelerate 1.15 YAML rules: ClusterConfig fields, what reads ACCELERATE_FP8_<KEY>, DeepSpeed-plugin conflicts;
the FSDP rules live in fsdp.py."""

from __future__ import annotations

import os

from .common import ERROR, WARNING, Problem, collector, truthy
from .fsdp import fix_fsdp, lint_fsdp_yaml

ACC_KEYS = {  # BaseConfig + ClusterConfig fields (+ "fp16"/"dynamo_backend", converted on load)
    "compute_environment", "distributed_type", "mixed_precision", "use_cpu", "debug",
    "num_processes", "machine_rank", "num_machines", "gpu_ids", "main_process_ip",
    "main_process_port", "rdzv_backend", "same_network", "main_training_function",
    "enable_cpu_affinity", "fp8_config", "deepspeed_config", "fsdp_config", "parallelism_config",
    "megatron_lm_config", "mpirun_config", "downcast_bf16", "tpu_name", "tpu_zone",
    "tpu_use_cluster", "tpu_use_sudo", "command_file", "commands", "tpu_vm", "tpu_env",
    "dynamo_config", "fp16", "dynamo_backend",
}
DISTRIBUTED_TYPES = {"NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA",
                     "MULTI_MUSA", "MULTI_XPU", "DEEPSPEED", "FSDP", "XLA", "MEGATRON_LM",
                     "MULTI_HPU", "MULTI_NEURON"}
MIXED_PRECISIONS = {"no", "fp16", "bf16", "fp8"}
FP8_BACKENDS = {"TE", "MSAMP", "AO"}
# fp8_config keys (without an "fp8_" prefix) whose ACCELERATE_FP8_<KEY> env var something reads
# (utils/dataclasses.py TERecipeKwargs / MSAMPRecipeKwargs / AORecipeKwargs / FP8RecipeKwargs).
FP8_READ_KEYS = {"backend", "use_autocast_during_eval", "margin", "interval", "format",
                 "amax_history_len", "amax_compute_algo", "override_linear_precision",
                 "use_mxfp8_block_scaling", "opt_level", "pad_inner_dim",
                 "enable_fsdp_float8_all_gather"}
FP8_DEAD_KEYS = {"amax_history_length": "amax_history_len",      # written by `accelerate config`,
                 "amax_compute_algorithm": "amax_compute_algo",  # read by nothing
                 "optimization_level": "opt_level"}
FP8_TE_DROPPED = {"interval", "override_linear_precision"}  # read by accelerate, not TE fields
DS_YAML_KEYS = {"zero_stage", "offload_optimizer_device", "offload_param_device",
                "offload_optimizer_nvme_path", "offload_param_nvme_path",
                "gradient_accumulation_steps", "gradient_clipping", "zero3_init_flag",
                "zero3_save_16bit_model", "deepspeed_config_file", "deepspeed_hostfile",
                "deepspeed_exclusion_filter", "deepspeed_inclusion_filter",
                "deepspeed_multinode_launcher", "deepspeed_moe_layer_cls_names"}
# with deepspeed_config_file, DeepSpeedPlugin._deepspeed_config_checks raises on these
DS_FILE_CONFLICTS = {"gradient_accumulation_steps", "gradient_clipping", "zero_stage",
                     "offload_optimizer_device", "offload_param_device",
                     "offload_param_nvme_path", "offload_optimizer_nvme_path",
                     "zero3_save_16bit_model"}


def _fp8_name(key: str) -> str:
    return key[4:] if key.startswith("fp8_") else key


# -- rules shared by the YAML linter and the launch-environment check (lint/launch.py) --------------
def fp8_key_problem(name: str) -> tuple[str, str] | None:
    """(message, fix) when the fp8_config key ``name`` (exported as ACCELERATE_FP8_<NAME>) is read by
    nothing or silently dropped; None when something reads it."""
    if name in FP8_DEAD_KEYS:
        return (f"written by `accelerate config` but read by nothing (accelerate reads "
                f"ACCELERATE_FP8_{FP8_DEAD_KEYS[name].upper()})", f"rename to {FP8_DEAD_KEYS[name]}")
    if name not in FP8_READ_KEYS and not name.startswith("override_"):
        return "exported as ACCELERATE_FP8_* but read by nothing", "remove it"
    if name in FP8_TE_DROPPED:
        return ("accelerate reads it but Transformer Engine's recipe has no such field any more: silently "
                "dropped", "remove it")
    return None


def precision_mismatch(mixed_precision: str | None, use_fp8: bool | None, source: str) -> tuple[str, str] | None:
    """(message, fix) when accelerate's mixed_precision and the yxanul config's use_fp8 disagree."""
    if use_fp8 is None or mixed_precision not in ("fp8", "bf16", "no") or (mixed_precision == "fp8") == use_fp8:
        return None
    return (f"{source} says {mixed_precision} but the yxanul config has use_fp8: {str(use_fp8).lower()}; "
            "yxanul's own setting wins (it passes mixed_precision to Accelerator itself)", "make them agree")


def lint_accelerate(cfg: dict, file: str, use_fp8: bool | None = None,
                    ds_file_exists=None) -> list[Problem]:
    """`ds_file_exists(path) -> bool` resolves deepspeed_config_file (None: not checked)."""
    P, add = collector(file)
    if not isinstance(cfg, dict):
        add("<root>", ERROR, "an accelerate config must be a YAML mapping", "write a mapping")
        return P
    dt = str(cfg.get("distributed_type", ""))
    mp = None if cfg.get("mixed_precision") is None else str(cfg["mixed_precision"])
    _check_keys(cfg, dt, add)
    _check_mixed_precision(mp, add)
    fp8 = _check_fp8_keys(cfg, add)
    _check_fp8_backend(fp8, mp, dt, add)
    _check_processes(cfg, dt, add)
    if dt == "DEEPSPEED":
        _check_deepspeed_plugin(cfg, mp, ds_file_exists, add)
    lint_fsdp_yaml(cfg, dt, use_fp8 if use_fp8 is not None else (mp == "fp8" if mp else None), add)
    if not (dt == "DEEPSPEED" and mp is None):
        found = precision_mismatch(mp, use_fp8, source="accelerate config")
        if found:
            add("mixed_precision", WARNING, *found)
    return P


# -- the rule families of lint_accelerate, in the order they report ---------------------------------
def _check_keys(cfg: dict, dt: str, add) -> None:
    """Keys ClusterConfig doesn't know; distributed_type missing or invalid."""
    for key in sorted(set(cfg) - ACC_KEYS):
        add(key, ERROR, "unknown key: accelerate's ClusterConfig.from_yaml_file raises ValueError "
            "('had unknown keys')", "remove it")
    if "distributed_type" not in cfg:
        add("distributed_type", ERROR, "missing: accelerate raises 'A `distributed_type` must be "
            "specified'", "add distributed_type: NO | MULTI_GPU | DEEPSPEED")
    elif dt not in DISTRIBUTED_TYPES:
        add("distributed_type", ERROR, f"invalid value {dt!r}", f"one of {sorted(DISTRIBUTED_TYPES)}")


def _check_mixed_precision(mp: str | None, add) -> None:
    if mp is not None and mp.lower() not in MIXED_PRECISIONS:
        add("mixed_precision", ERROR, f"invalid value {mp!r}", "one of no, fp16, bf16, fp8")
    if mp == "fp16":
        add("mixed_precision", WARNING, "yxanul trains in bf16 or fp8, never fp16",
            "use bf16 or fp8")


def _check_fp8_keys(cfg: dict, add) -> dict:
    """fp8_config: a mapping, keys something reads, amax_compute_algo that reaches TE. Returns it ({}: none)."""
    fp8 = cfg.get("fp8_config") or {}
    if not isinstance(fp8, dict):
        add("fp8_config", ERROR, "must be a mapping", "write fp8_config: {backend: TE}")
        fp8 = {}
    for key in fp8:
        found = fp8_key_problem(_fp8_name(key))
        if found:
            add(f"fp8_config.{key}", WARNING, *found)
    algo = fp8.get("amax_compute_algo", fp8.get("fp8_amax_compute_algo"))
    if isinstance(algo, str) and algo.lower() == "most_recent":
        add("fp8_config.amax_compute_algo", WARNING, "'most_recent' is accelerate's default, so it "
            "is never passed to TE, whose default 'max' applies", "remove it (TE uses max)")
    return fp8


def _check_fp8_backend(fp8: dict, mp: str | None, dt: str, add) -> None:
    """The FP8 backend: valid, upper case, TE under mixed_precision fp8; fp8_config without fp8."""
    backend = fp8.get("backend", fp8.get("fp8_backend"))
    if backend is not None:
        if str(backend).upper() in FP8_BACKENDS and str(backend) != str(backend).upper():
            add("fp8_config.backend", ERROR, f"{backend!r} is exported as-is and "
                f"FP8BackendType({str(backend)!r}) raises ValueError (upper case only)",
                f"write backend: {str(backend).upper()}")
        elif str(backend) not in FP8_BACKENDS:
            add("fp8_config.backend", ERROR, f"invalid FP8 backend {backend!r}", "backend: TE")
    if mp == "fp8":
        if backend is None:
            add("fp8_config.backend", WARNING, "not set: accelerate auto-detects in the order "
                "torchao -> TE -> MS-AMP (accelerator.py), so torchao wins when installed and "
                "NVTE_* settings do nothing", "add fp8_config: {backend: TE}")
        elif str(backend).upper() in ("AO", "MSAMP"):
            add("fp8_config.backend", WARNING, f"yxanul's FP8 path is Transformer Engine; "
                f"{str(backend).upper()} is not what the trainer enters", "backend: TE")
    elif fp8 and dt != "DEEPSPEED":
        add("fp8_config", WARNING, "ignored: accelerate exports fp8_config only when "
            "mixed_precision is fp8", "remove fp8_config or set mixed_precision: fp8")


def _check_processes(cfg: dict, dt: str, add) -> None:
    """num_processes / num_machines against the launcher that distributed_type picks."""
    nproc, nmach = cfg.get("num_processes"), cfg.get("num_machines", 1)
    if dt == "MULTI_CPU" and isinstance(nproc, int) and nproc > 1 and not cfg.get("mpirun_config"):
        add("distributed_type", ERROR, f"MULTI_CPU without mpirun_config: `accelerate launch` "
            f"starts ONE process (simple launcher), not {nproc}", "use distributed_type: "
            "MULTI_GPU with use_cpu: true and launch with ACCELERATE_USE_CPU=1 (torchrun, gloo)")
    if dt == "MULTI_GPU" and truthy(cfg.get("use_cpu")) and not truthy(os.environ.get("ACCELERATE_USE_CPU")):
        add("use_cpu", WARNING, "accelerate's torchrun launcher does not pass use_cpu to its workers: without "
            "ACCELERATE_USE_CPU=1 in the environment every script launched with this profile (`accelerate test` "
            "too) runs as separate 1-process jobs", "launch with ACCELERATE_USE_CPU=1 accelerate launch|test ...")
    if dt in ("MULTI_GPU", "DEEPSPEED", "FSDP") and nproc in (None, -1):
        add("num_processes", WARNING, "not set: accelerate raises unless --num_processes is "
            "passed on the command line", "set num_processes (all processes, every node)")
    if isinstance(nproc, int) and isinstance(nmach, int) and nmach > 1 and nproc % nmach:
        add("num_processes", ERROR, f"{nproc} processes do not split over {nmach} machines "
            "(num_processes counts every node)", "num_processes = num_machines x GPUs per node")


def _check_deepspeed_plugin(cfg: dict, mp: str | None, ds_file_exists, add) -> None:
    """deepspeed_config: accelerate's options only; with a deepspeed_config_file, no key it conflicts with."""
    ds = cfg.get("deepspeed_config") or {}
    if not isinstance(ds, dict):
        add("deepspeed_config", ERROR, f"expected a mapping of accelerate's DeepSpeed options, got {ds!r}",
            "write deepspeed_config: {deepspeed_config_file: ds_configs/...json} (or its options)")
        return
    for key in sorted(set(ds) - DS_YAML_KEYS):
        add(f"deepspeed_config.{key}", WARNING, "not an accelerate DeepSpeed option: ignored",
            "remove it")
    if truthy(ds.get("zero3_init_flag")):
        add("deepspeed_config.zero3_init_flag", WARNING, "has no effect in yxanul: deepspeed.zero.Init applies "
            "to models built while accelerate's HfDeepSpeedConfig exists, and yxanul builds its model before the "
            "Accelerator (every process holds the whole model until DeepSpeed partitions it at prepare)",
            "set zero3_init_flag: false")
    path = ds.get("deepspeed_config_file")
    if not path:
        add("deepspeed_config.deepspeed_config_file", WARNING, "not set: accelerate builds a "
            "DeepSpeed config from zero_stage (default 2) and friends", "point it at "
            "ds_configs/zero1.json")
        return
    if "mixed_precision" in cfg and mp is not None:
        add("mixed_precision", ERROR, "with deepspeed_config_file accelerate raises "
            "ValueError ('the following accelerate config variables will be ignored') "
            "when mixed_precision comes from the YAML", "remove mixed_precision: yxanul "
            "sets it from its own config (use_fp8)")
    for key in sorted(DS_FILE_CONFLICTS & set(ds)):
        add(f"deepspeed_config.{key}", ERROR, "with deepspeed_config_file accelerate "
            "raises ValueError for this key", "remove it; set it in the DeepSpeed JSON")
    if ds_file_exists is not None and not ds_file_exists(path):
        add("deepspeed_config.deepspeed_config_file", WARNING, f"{path} not found "
            "(resolved from the current directory at launch)",
            "launch from the repository root or give an absolute path")


def fix_accelerate(cfg: dict) -> dict:
    import copy

    cfg = copy.deepcopy(cfg)
    for key in set(cfg) - ACC_KEYS:
        del cfg[key]
    fp8 = cfg.get("fp8_config") if isinstance(cfg.get("fp8_config"), dict) else {}
    new = {}
    for key, value in fp8.items():
        name = FP8_DEAD_KEYS.get(_fp8_name(key), _fp8_name(key))
        if name in FP8_READ_KEYS and name not in FP8_TE_DROPPED:
            if name == "amax_compute_algo" and str(value).lower() == "most_recent":
                continue
            new[name] = str(value).upper() if name == "backend" else value
    if cfg.get("mixed_precision") == "fp8":
        new["backend"] = "TE"  # yxanul's FP8 path
    dt = cfg.get("distributed_type")
    if (new and cfg.get("mixed_precision") != "fp8") or not new:
        cfg.pop("fp8_config", None)
    else:
        cfg["fp8_config"] = new
    if dt == "MULTI_CPU" and (cfg.get("num_processes") or 1) > 1 and not cfg.get("mpirun_config"):
        cfg["distributed_type"], cfg["use_cpu"] = "MULTI_GPU", True
    fix_fsdp(cfg)
    if dt == "DEEPSPEED":
        if not isinstance(cfg.get("deepspeed_config") or {}, dict):
            cfg.pop("deepspeed_config")  # nothing in it to keep: the lint of the copy asks for one
        ds = cfg.get("deepspeed_config") or {}
        for key in set(ds) - DS_YAML_KEYS:
            del ds[key]
        if truthy(ds.get("zero3_init_flag")):
            ds["zero3_init_flag"] = False
        if ds.get("deepspeed_config_file"):
            cfg.pop("mixed_precision", None)
            for key in DS_FILE_CONFLICTS:
                ds.pop(key, None)
    return cfg
