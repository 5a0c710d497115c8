"""Rules of `yxanul lint-config`: what DeepSpeed 0.19 and accelerate 1.15 really read.

Every list below was read from the sources (tests/test_lint.py compares them with the installed
packages where those are importable):
- DeepSpeed: runtime/config.py `_REMOVED_TOP_LEVEL_CONFIG_KEYS` / `_REMOVED_ZERO_CONFIG_KEYS`
  (raise DeepSpeedConfigError), pydantic models with extra="forbid": runtime/precision_config.py
  (bf16, fp16), runtime/zero/config.py, runtime/zero/offload_config.py.
- accelerate: commands/config/config_args.py `ClusterConfig` (unknown top-level key -> ValueError),
  commands/launch.py (fp8_config keys -> ACCELERATE_FP8_<KEY>), utils/dataclasses.py (readers of
  those env vars), accelerator.py `_prepare_deepspeed` (the "auto" values it fills).
Each rule yields `Problem`s; `fix` rules mutate a copy (used by `yxanul lint-config --fix`).
"""

from __future__ import annotations

from dataclasses import dataclass

ERROR, WARNING = "error", "warning"


@dataclass
class Problem:
    file: str
    key: str          # dotted key path, e.g. "zero_optimization.stage"
    severity: str     # "error" (refuses to start / the tool raises) | "warning"
    message: str      # the reason
    fix: str          # what to do

    def line(self) -> str:
        return f"{self.file}: {self.severity}: {self.key}: {self.message} -> fix: {self.fix}"

    __str__ = line


# ---------------------------------------------------------------- DeepSpeed
DS_REMOVED_TOP = {
    "nebula", "compression_training", "amp", "quantize_training", "sparse_gradients", "eigenvalue",
    "sparse_attention", "elasticity", "graph_harvesting", "curriculum_learning",
    "progressive_layer_drop",
}
DS_REMOVED_ZERO = {"mics_shard_size", "mics_hierarchical_params_gather", "zeropp_loco_param"}
DS_BF16_KEYS = {"enabled", "immediate_grad_update", "check_grad_overflow",
                "bf16_master_weights_and_grads", "bf16_optimizer_states"}
DS_FP16_KEYS = {"enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window",
                "hysteresis", "consecutive_hysteresis", "min_loss_scale",
                "fp16_master_weights_and_grads"}
DS_ZERO_KEYS = {
    "stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size",
    "use_multi_rank_bucket_allreduce", "allgather_partitions", "allgather_bucket_size",
    "overlap_comm", "compute_grad_norm", "load_from_fp32_weights", "elastic_checkpoint",
    "offload_param", "offload_optimizer", "zenflow", "sub_group_size", "cpu_offload_param",
    "cpu_offload_use_pin_memory", "cpu_offload", "prefetch_bucket_size",
    "stage3_prefetch_bucket_size", "param_persistence_threshold",
    "stage3_param_persistence_threshold", "model_persistence_threshold",
    "stage3_model_persistence_threshold", "max_live_parameters", "stage3_max_live_parameters",
    "max_reuse_distance", "stage3_max_reuse_distance", "gather_16bit_weights_on_model_save",
    "stage3_gather_16bit_weights_on_model_save", "module_granularity_threshold",
    "stage3_module_granularity_threshold", "use_all_reduce_for_fetch_params",
    "stage3_use_all_reduce_for_fetch_params", "allgather_sequential", "stage3_allgather_sequential",
    "stage3_gather_fp16_weights_on_model_save", "ignore_unused_parameters", "legacy_stage1",
    "round_robin_gradients", "parameter_alignment", "zero_hpz_partition_size",
    "zero_quantized_weights", "zero_quantized_nontrainable_weights", "zero_quantized_gradients",
    "memory_efficient_linear", "pipeline_loading_checkpoint", "override_module_apply",
    "log_trace_cache_warnings", "enable_sanity_checks", "save_muon_momentum_buffer_in_memory",
    "leaf_module",
}
DS_OFFLOAD_OPTIMIZER_KEYS = {"device", "nvme_path", "buffer_count", "pin_memory", "pipeline_read",
                             "pipeline_write", "fast_init", "ratio", "super_offload",
                             "cpuadam_cores_perc"}
DS_OFFLOAD_PARAM_KEYS = {"device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu",
                         "pin_memory"}
STRICT_BLOCKS = {
    "bf16": DS_BF16_KEYS, "fp16": DS_FP16_KEYS, "zero_optimization": DS_ZERO_KEYS,
    "zero_optimization.offload_optimizer": DS_OFFLOAD_OPTIMIZER_KEYS,
    "zero_optimization.offload_param": DS_OFFLOAD_PARAM_KEYS,
}
# "auto" values accelerate fills (DeepSpeedPlugin.__post_init__/set_mixed_precision,
# Accelerator._prepare_deepspeed). The hidden-size ones need model.config.hidden_size (yxanul has it).
DS_AUTO_FILLED = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "gradient_clipping", "fp16.enabled", "bf16.enabled", "zero_optimization.stage",
    "zero_optimization.offload_optimizer.device", "zero_optimization.offload_param.device",
    "zero_optimization.offload_optimizer.nvme_path", "zero_optimization.offload_param.nvme_path",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.reduce_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
}


def _get(d: dict, path: str):
    for part in path.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def _delete(d: dict, path: str) -> None:
    *parents, last = path.split(".")
    for part in parents:
        d = d.get(part) if isinstance(d, dict) else None
    if isinstance(d, dict):
        d.pop(last, None)


def _prune(d: dict) -> None:
    for k in [k for k, v in d.items() if isinstance(v, dict)]:
        _prune(d[k])
        if not d[k]:
            del d[k]


def _truthy(v) -> bool:
    return v is True or (isinstance(v, str) and v.lower() in ("true", "1", "yes", "auto"))


def _walk(d: dict, prefix: str = ""):
    for k, v in d.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from _walk(v, path + ".")
        else:
            yield path, v


def harmful_ds_keys(cfg: dict) -> list[tuple[str, str, str]]:
    """(key, reason, fix) for keys that DeepSpeed accepts but that waste time or mislead:
    removed (with a warning) by `sanitize_deepspeed_config`."""
    out = []
    low_precision = _truthy(_get(cfg, "bf16.enabled")) or _truthy(_get(cfg, "bfloat16.enabled"))
    if "fp8" in cfg:
        out.append(("fp8", "DeepSpeed has no FP8 section and ignores it silently: FP8 is done by "
                    "accelerate + Transformer Engine (yxanul --use_fp8), DeepSpeed only shards "
                    "optimizer state", "remove the \"fp8\" block; set use_fp8: true in the yxanul config"))
    comm = cfg.get("communication_data_type")
    if isinstance(comm, str) and comm.lower() in ("fp32", "float32") and low_precision:
        out.append(("communication_data_type", "fp32 gradient communication under bf16/fp8 casts "
                    "every gradient bucket to fp32 and doubles all-reduce traffic",
                    "remove it (DeepSpeed then communicates in the model dtype, bf16)"))
    gad = _get(cfg, "data_types.grad_accum_dtype")
    if isinstance(gad, str) and gad.lower() in ("fp32", "float32", "float", "torch.float32") \
            and low_precision:
        out.append(("data_types.grad_accum_dtype", "fp32 gradient accumulation with bf16 makes "
                    "ZeRO-1 select DeepSpeed's BF16_Optimizer (engine._do_optimizer_sanity_check) "
                    "instead of the ZeRO optimizer, with an extra fp32 gradient copy and casts",
                    "remove it (gradients accumulate in bf16 on the ZeRO-1 path)"))
    return out


def lint_deepspeed(cfg: dict, file: str, world_size: int | None = None) -> list[Problem]:
    P = []

    def add(key, sev, msg, fix):
        P.append(Problem(file, key, sev, msg, fix))

    if not isinstance(cfg, dict):
        add("<root>", ERROR, "a DeepSpeed config must be a JSON object", "write a JSON object")
        return P
    for key, msg, fix in harmful_ds_keys(cfg):
        add(key, WARNING, msg, fix)
    for key in sorted(DS_REMOVED_TOP & set(cfg)):
        add(key, ERROR, "removed from DeepSpeed: DeepSpeedConfig raises DeepSpeedConfigError",
            f"remove \"{key}\"")
    zero = cfg.get("zero_optimization")
    if not isinstance(zero, dict):
        add("zero_optimization", ERROR, "missing: accelerate's DeepSpeedPlugin raises 'Please "
            "specify the ZeRO optimization config'", "add \"zero_optimization\": {\"stage\": 1}")
    else:
        for key in sorted(DS_REMOVED_ZERO & set(zero)):
            add(f"zero_optimization.{key}", ERROR, "removed from DeepSpeed: DeepSpeedConfig "
                "raises DeepSpeedConfigError", "remove it")
    for block, valid in STRICT_BLOCKS.items():
        sub = _get(cfg, block)
        if isinstance(sub, dict):
            for key in sorted(set(sub) - valid - (DS_REMOVED_ZERO if block == "zero_optimization" else set())):
                add(f"{block}.{key}", ERROR, f"unknown key in '{block}': DeepSpeed's pydantic "
                    "model forbids extra keys and raises ValidationError",
                    f"remove it (valid: {', '.join(sorted(valid)[:8])}, ...)")
    fp16_on = _get(cfg, "fp16.enabled")
    if fp16_on is True or (isinstance(fp16_on, str) and fp16_on.lower() == "true"):
        add("fp16.enabled", ERROR, "yxanul trains in bf16 or fp8; accelerate raises ValueError "
            "when mixed precision is bf16/fp8 and the DeepSpeed config enables fp16 (and "
            "DeepSpeed asserts when fp16 and bf16 are both enabled)",
            "remove the \"fp16\" block and keep \"bf16\": {\"enabled\": \"auto\"}")
    for block in ("optimizer", "scheduler"):
        if block in cfg:
            add(block, ERROR, f"yxanul builds its own {block}; accelerate raises 'You cannot "
                f"specify an {block} in the config file and in the code at the same time' (and a "
                "DeepSpeed optimizer cannot be prepared together with TE FP8 layers)",
                f"remove \"{block}\"; set the learning rate etc. in the yxanul config")
    for path, value in _walk(cfg):
        if value == "auto" and path not in DS_AUTO_FILLED:
            add(path, ERROR, "accelerate does not fill 'auto' for this key: DeepSpeed would see "
                "the string 'auto' (top-level scalars fail, pydantic blocks silently use defaults)",
                "set a concrete value or remove the key")
    comm = cfg.get("communication_data_type")
    if comm is not None and comm != "auto" and str(comm).lower() not in ("fp16", "bf16", "fp32"):
        add("communication_data_type", ERROR, f"invalid value {comm!r}: DeepSpeed accepts fp16, "
            "bf16, fp32", "remove it")
    tb, mb, ga = (cfg.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                        "gradient_accumulation_steps"))
    if isinstance(tb, int) and not isinstance(tb, bool):
        if isinstance(mb, int) and isinstance(ga, int):
            if tb % (mb * ga):
                add("train_batch_size", ERROR, f"{tb} is not a multiple of micro batch {mb} x "
                    f"accumulation {ga}: DeepSpeed asserts train_batch_size == micro x accum x "
                    "world size", "set \"train_batch_size\": \"auto\"")
            elif world_size and tb != mb * ga * world_size:
                add("train_batch_size", ERROR, f"{tb} != micro {mb} x accumulation {ga} x world "
                    f"size {world_size} = {mb * ga * world_size}: DeepSpeed raises at initialize",
                    "set \"train_batch_size\": \"auto\"")
        elif mb == "auto" or ga == "auto":
            add("train_batch_size", WARNING, f"fixed at {tb} while micro batch/accumulation are "
                "'auto': accelerate keeps the fixed value and DeepSpeed raises unless it equals "
                "micro x accumulation x world size exactly", "set \"train_batch_size\": \"auto\"")
    return P


def fix_deepspeed(cfg: dict) -> dict:
    import copy

    cfg = copy.deepcopy(cfg)
    for key, _, _ in harmful_ds_keys(cfg):
        _delete(cfg, key)
    for key in DS_REMOVED_TOP | {"optimizer", "scheduler", "fp16"}:
        cfg.pop(key, None)
    zero = cfg.setdefault("zero_optimization", {"stage": 1})
    if not isinstance(zero, dict):
        cfg["zero_optimization"] = zero = {"stage": 1}
    for key in DS_REMOVED_ZERO:
        zero.pop(key, None)
    for block, valid in STRICT_BLOCKS.items():
        sub = _get(cfg, block)
        if isinstance(sub, dict):
            for key in set(sub) - valid:
                del sub[key]
    for path, value in list(_walk(cfg)):
        if value == "auto" and path not in DS_AUTO_FILLED:
            _delete(cfg, path)
    comm = cfg.get("communication_data_type")
    if comm is not None and str(comm).lower() not in ("fp16", "bf16", "fp32"):
        cfg.pop("communication_data_type")
    if isinstance(cfg.get("train_batch_size"), int):
        cfg["train_batch_size"] = "auto"
    cfg.setdefault("bf16", {"enabled": "auto"})
    _prune(cfg)
    cfg.setdefault("zero_optimization", {"stage": 1})
    return cfg


# ---------------------------------------------------------------- accelerate YAML
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


def lint_accelerate(cfg: dict, file: str, use_fp8: bool | None = None,
                    ds_file_exists=None) -> list[Problem]:
    """`ds_file_exists(path) -> bool` resolves deepspeed_config_file (None: not checked)."""
    P = []

    def add(key, sev, msg, fix):
        P.append(Problem(file, key, sev, msg, fix))

    if not isinstance(cfg, dict):
        add("<root>", ERROR, "an accelerate config must be a YAML mapping", "write a mapping")
        return P
    for key in sorted(set(cfg) - ACC_KEYS):
        add(key, ERROR, "unknown key: accelerate's ClusterConfig.from_yaml_file raises ValueError "
            "('had unknown keys')", "remove it")
    dt = str(cfg.get("distributed_type", ""))
    if "distributed_type" not in cfg:
        add("distributed_type", ERROR, "missing: accelerate raises 'A `distributed_type` must be "
            "specified'", "add distributed_type: NO | MULTI_GPU | DEEPSPEED")
    elif dt not in DISTRIBUTED_TYPES:
        add("distributed_type", ERROR, f"invalid value {dt!r}", f"one of {sorted(DISTRIBUTED_TYPES)}")
    mp = cfg.get("mixed_precision")
    mp = None if mp is None else str(mp)
    if mp is not None and mp.lower() not in MIXED_PRECISIONS:
        add("mixed_precision", ERROR, f"invalid value {mp!r}", "one of no, fp16, bf16, fp8")
    if mp == "fp16":
        add("mixed_precision", WARNING, "yxanul trains in bf16 or fp8, never fp16",
            "use bf16 or fp8")
    fp8 = cfg.get("fp8_config") or {}
    if not isinstance(fp8, dict):
        add("fp8_config", ERROR, "must be a mapping", "write fp8_config: {backend: TE}")
        fp8 = {}
    for key in fp8:
        name = _fp8_name(key)
        if name in FP8_DEAD_KEYS:
            add(f"fp8_config.{key}", WARNING, f"written by `accelerate config` but read by nothing "
                f"(accelerate reads ACCELERATE_FP8_{FP8_DEAD_KEYS[name].upper()})",
                f"rename to {FP8_DEAD_KEYS[name]}")
        elif name not in FP8_READ_KEYS:
            add(f"fp8_config.{key}", WARNING, "exported as ACCELERATE_FP8_* but read by nothing",
                "remove it")
        elif name in FP8_TE_DROPPED:
            add(f"fp8_config.{key}", WARNING, "accelerate reads it but Transformer Engine's recipe "
                "has no such field any more: silently dropped", "remove it")
    algo = fp8.get("amax_compute_algo", fp8.get("fp8_amax_compute_algo"))
    if isinstance(algo, str) and algo.lower() == "most_recent":
        add("fp8_config.amax_compute_algo", WARNING, "'most_recent' is accelerate's default, so it "
            "is never passed to TE, whose default 'max' applies", "remove it (TE uses max)")
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
    nproc, nmach = cfg.get("num_processes"), cfg.get("num_machines", 1)
    if dt == "MULTI_CPU" and isinstance(nproc, int) and nproc > 1 and not cfg.get("mpirun_config"):
        add("distributed_type", ERROR, f"MULTI_CPU without mpirun_config: `accelerate launch` "
            f"starts ONE process (simple launcher), not {nproc}", "use distributed_type: "
            "MULTI_GPU with use_cpu: true and launch with ACCELERATE_USE_CPU=1 (torchrun, gloo)")
    if dt in ("MULTI_GPU", "DEEPSPEED", "FSDP") and nproc in (None, -1):
        add("num_processes", WARNING, "not set: accelerate raises unless --num_processes is "
            "passed on the command line", "set num_processes (all processes, every node)")
    if isinstance(nproc, int) and isinstance(nmach, int) and nmach > 1 and nproc % nmach:
        add("num_processes", ERROR, f"{nproc} processes do not split over {nmach} machines "
            "(num_processes counts every node)", "num_processes = num_machines x GPUs per node")
    if dt == "DEEPSPEED":
        ds = cfg.get("deepspeed_config") or {}
        for key in sorted(set(ds) - DS_YAML_KEYS):
            add(f"deepspeed_config.{key}", WARNING, "not an accelerate DeepSpeed option: ignored",
                "remove it")
        path = ds.get("deepspeed_config_file")
        if not path:
            add("deepspeed_config.deepspeed_config_file", WARNING, "not set: accelerate builds a "
                "DeepSpeed config from zero_stage (default 2) and friends", "point it at "
                "ds_configs/zero1.json")
        else:
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
    if use_fp8 is not None and mp in ("fp8", "bf16", "no") and not (dt == "DEEPSPEED" and mp is None):
        says_fp8 = mp == "fp8"
        if says_fp8 != use_fp8:
            add("mixed_precision", WARNING, f"accelerate config says {mp} but the yxanul config "
                f"has use_fp8: {str(use_fp8).lower()}; yxanul's own setting wins (it passes "
                "mixed_precision to Accelerator itself)", "make them agree")
    return P


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
    if dt == "DEEPSPEED":
        ds = cfg.get("deepspeed_config") or {}
        for key in set(ds) - DS_YAML_KEYS:
            del ds[key]
        if ds.get("deepspeed_config_file"):
            cfg.pop("mixed_precision", None)
            for key in DS_FILE_CONFLICTS:
                ds.pop(key, None)
    return cfg
