"""DeepSpeed 0.19 JSON rules: runtime/config.py removed keys, the pydantic models with extra="forbid",
and the "auto" values accelerate fills."""

from __future__ import annotations

from .common import ERROR, WARNING, Problem, _delete, _get, _prune, _walk, collector, truthy

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


def harmful_ds_keys(cfg: dict) -> list[tuple[str, str, str]]:
    """(key, reason, fix) for keys that DeepSpeed accepts but that waste time or mislead:
    removed (with a warning) by `sanitize_deepspeed_config`."""
    out = []
    # "auto" counts: accelerate fills bf16.enabled from mixed_precision, which is bf16 or fp8 for yxanul
    low_precision = any(truthy(v) or v == "auto" for v in (_get(cfg, "bf16.enabled"), _get(cfg, "bfloat16.enabled")))
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


def lint_deepspeed(cfg: dict, file: str, world_size: int | None = None, use_fp8: bool | None = None) -> list[Problem]:
    """The problems of a DeepSpeed JSON config, in rule order (`world_size`: check train_batch_size
    against it too; `use_fp8`: the yxanul config's, for the ZeRO-3 + Transformer Engine rules)."""
    P, add = collector(file)
    if not isinstance(cfg, dict):
        add("<root>", ERROR, "a DeepSpeed config must be a JSON object", "write a JSON object")
        return P
    for key, msg, fix in harmful_ds_keys(cfg):
        add(key, WARNING, msg, fix)
    _check_removed_keys(cfg, add)
    _check_strict_blocks(cfg, add)
    _check_yxanul_owns(cfg, add)
    _check_values(cfg, add)
    _check_batch_size(cfg, world_size, add)
    if use_fp8:
        _check_zero3_fp8(cfg, add)
    return P


# -- the rule families of lint_deepspeed, in the order they report ----------------------------------
def _check_removed_keys(cfg: dict, add) -> None:
    """Keys DeepSpeed removed (DeepSpeedConfigError); zero_optimization missing."""
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


def _check_strict_blocks(cfg: dict, add) -> None:
    """Unknown keys in the blocks whose pydantic models forbid extra keys."""
    for block, valid in STRICT_BLOCKS.items():
        sub = _get(cfg, block)
        if isinstance(sub, dict):
            for key in sorted(set(sub) - valid - (DS_REMOVED_ZERO if block == "zero_optimization" else set())):
                add(f"{block}.{key}", ERROR, f"unknown key in '{block}': DeepSpeed's pydantic "
                    "model forbids extra keys and raises ValidationError",
                    f"remove it (valid: {', '.join(sorted(valid)[:8])}, ...)")


def _check_yxanul_owns(cfg: dict, add) -> None:
    """What yxanul sets itself: the precision (never fp16), the optimizer and the scheduler."""
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


def _check_values(cfg: dict, add) -> None:
    """Values: "auto" where accelerate fills nothing, a communication_data_type DeepSpeed refuses."""
    for path, value in _walk(cfg):
        if value == "auto" and path not in DS_AUTO_FILLED:
            add(path, ERROR, "accelerate does not fill 'auto' for this key: DeepSpeed would see "
                "the string 'auto' (top-level scalars fail, pydantic blocks silently use defaults)",
                "set a concrete value or remove the key")
    comm = cfg.get("communication_data_type")
    if comm is not None and comm != "auto" and str(comm).lower() not in ("fp16", "bf16", "fp32"):
        add("communication_data_type", ERROR, f"invalid value {comm!r}: DeepSpeed accepts fp16, "
            "bf16, fp32", "remove it")


def _check_batch_size(cfg: dict, world_size: int | None, add) -> None:
    """A fixed train_batch_size must be micro x accumulation x world size exactly."""
    tb, mb, ga = (cfg.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                        "gradient_accumulation_steps"))
    if not isinstance(tb, int) or isinstance(tb, bool):
        return
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


def _check_zero3_fp8(cfg: dict, add) -> None:
    """ZeRO-3 with TE FP8: what silently costs the FP8 speed or adds a second weight rounding. (What
    breaks is handled in code: TE's FP8 weight cache is off under ZeRO-3, precision/plan.py.)"""
    zero = cfg.get("zero_optimization")
    if not isinstance(zero, dict) or zero.get("stage") != 3:
        return
    if truthy(zero.get("zero_quantized_weights")):
        add("zero_optimization.zero_quantized_weights", WARNING, "ZeRO++ all-gathers the weights as int8 "
            "blocks (DeepSpeed's CUDAQuantizer) and dequantizes them; TE then quantizes those to FP8: two "
            "roundings of every weight in every forward", "remove it (FP8 runs gather bf16 weights)")
    device = _get(cfg, "zero_optimization.offload_param.device")
    if isinstance(device, str) and device.lower() in ("cpu", "nvme"):
        add("zero_optimization.offload_param.device", WARNING, f"parameters live on {device} and are copied "
            "to the GPU for every module's forward and backward: the step is bound by those copies, not by the "
            "GEMMs FP8 speeds up", "remove offload_param (or train in bf16), or shard over more GPUs")


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
