"""FSDP rules (accelerate 1.15 ``fsdp_config`` / the ``FSDP_*`` variables `accelerate launch` exports from
it, utils/launch.py): what makes yxanul refuse the run, what silently costs the memory FSDP2 is for or
the step time FP8 is for. One rule set serves the YAML (`lint_fsdp_yaml`) and the launch environment
(`lint_fsdp_env`); `fix_fsdp` writes the values that pass."""

from __future__ import annotations

from .common import ERROR, WARNING, truthy

# YAML key of fsdp_config -> the variable accelerate exports for it (utils/launch.py prepare_multi_gpu_env)
ENV = {"fsdp_version": "FSDP_VERSION", "fsdp_offload_params": "FSDP_OFFLOAD_PARAMS",
       "fsdp_reshard_after_forward": "FSDP_RESHARD_AFTER_FORWARD", "fsdp_auto_wrap_policy": "FSDP_AUTO_WRAP_POLICY",
       "fsdp_state_dict_type": "FSDP_STATE_DICT_TYPE"}
# what passes, and what `fix_fsdp` writes
GOOD = {"fsdp_version": 2, "fsdp_offload_params": False, "fsdp_reshard_after_forward": True,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_state_dict_type": "SHARDED_STATE_DICT"}


def _rules(get, use_fp8: bool | None, add) -> None:
    """``get(yaml_key)`` -> the value (None: unset, accelerate's default applies)."""
    version = get("fsdp_version")
    if str(version if version is not None else 1) != "2":
        add("fsdp_version", ERROR, f"{version if version is not None else 'unset (accelerate: 1)'}: yxanul "
            "trains with FSDP2 (fully_shard) only and refuses to start under FSDP1", "fsdp_version: 2")
    if truthy(get("fsdp_offload_params")):
        slow = "the GEMMs FP8 speeds up" if use_fp8 is not False else "the GEMMs"
        add("fsdp_offload_params", WARNING, "parameters, gradients and Adam states live in host memory "
            "(torch's CPUOffloadPolicy): every layer is copied to the GPU for its forward and its backward and "
            f"the optimizer steps on the CPU, so the step is bound by those copies, not by {slow}",
            "fsdp_offload_params: false (shard over more GPUs instead; `yxanul plan`)")
    reshard = get("fsdp_reshard_after_forward")
    if reshard is not None and not truthy(reshard) and str(reshard).upper() != "FULL_SHARD":
        add("fsdp_reshard_after_forward", WARNING, f"{reshard}: each layer's all-gathered weights stay on "
            "every GPU from its forward to its backward, so at the peak every GPU holds the whole unsharded "
            "model (ZeRO-2 memory with ZeRO-3 traffic)", "fsdp_reshard_after_forward: true")
    wrap = get("fsdp_auto_wrap_policy")
    if wrap is not None and str(wrap).upper() != "TRANSFORMER_BASED_WRAP":
        add("fsdp_auto_wrap_policy", WARNING, f"{wrap}: the FSDP units are not the decoder layers (NO_WRAP: "
            "the whole model is one unit, all-gathered at once for every forward and backward, with no "
            "overlap of communication and compute)", "fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP "
            "(yxanul picks the decoder-layer class of the torch or TE backend)")
    sd = get("fsdp_state_dict_type")
    if sd is not None and str(sd).upper() != "SHARDED_STATE_DICT":
        add("fsdp_state_dict_type", WARNING, f"{sd}: every checkpoint gathers the whole model and optimizer "
            "on rank 0 (host memory and save time grow with the model) into a file `yxanul export`/`eval` do "
            "not read; the sharded layout writes one shard per rank and resumes at any world size",
            "fsdp_state_dict_type: SHARDED_STATE_DICT")


def lint_fsdp_yaml(cfg: dict, dt: str, use_fp8: bool | None, add) -> None:
    """``fsdp_config`` of an accelerate YAML (only read when distributed_type is FSDP) and HSDP's sizes."""
    fsdp = cfg.get("fsdp_config") or {}
    if dt != "FSDP":
        if fsdp:
            add("fsdp_config", WARNING, f"ignored: accelerate reads it only with distributed_type FSDP, not {dt}",
                "remove fsdp_config or set distributed_type: FSDP")
        return
    if not isinstance(fsdp, dict):
        add("fsdp_config", ERROR, "must be a mapping", "write fsdp_config: {fsdp_version: 2}")
        return
    _rules(fsdp.get, use_fp8, lambda key, *rest: add(f"fsdp_config.{key}", *rest))
    par = cfg.get("parallelism_config") or {}
    if par:
        _mesh_rule([par.get(f"parallelism_config_{k}_size", 1) for k in MESH], cfg.get("num_processes"),
                   "parallelism_config", add)


MESH = ("dp_replicate", "dp_shard", "tp", "cp")  # accelerate's ParallelismConfig sizes


def _mesh_rule(sizes: list, nproc, key: str, add) -> None:
    """The HSDP/FSDP2 mesh (dp_replicate x dp_shard x tp x cp) must hold exactly the job's processes: accelerate
    raises otherwise (on CPU: "Mesh should not be bigger than default world size", a traceback per rank)."""
    try:
        sizes, nproc = [int(s) for s in sizes], int(nproc)
    except (TypeError, ValueError):
        return
    total = sizes[0] * sizes[1] * sizes[2] * sizes[3]
    if nproc > 0 and total != nproc:
        add(key, ERROR, f"dp_replicate x dp_shard x tp x cp = {total}, not num_processes {nproc}: accelerate's "
            "ParallelismConfig raises", "dp_replicate_size = nodes, dp_shard_size = GPUs per node "
            "(--parallelism_config_dp_replicate_size / --parallelism_config_dp_shard_size)")
    elif sizes[1] == 1 and sizes[3] == 1:  # e.g. HSDP with one GPU per node: accelerate raises on every rank
        add(key, ERROR, "dp_shard_size 1 (and cp_size 1): FSDP has nothing to shard across, accelerate raises",
            "dp_shard_size = GPUs per node (> 1); with one GPU per node, DDP (multi_node_fp8.yaml) or fsdp2.yaml "
            "over all the processes")


def lint_fsdp_env(env, use_fp8: bool | None, add) -> None:
    """The same rules on what `accelerate launch` exported (``FSDP_*``, ``PARALLELISM_CONFIG_*``)."""
    names = {v: k for k, v in ENV.items()}
    _rules(lambda key: env.get(ENV[key]), use_fp8, lambda key, *rest: add(ENV.get(key, names.get(key, key)), *rest))
    if any(f"PARALLELISM_CONFIG_{k.upper()}_SIZE" in env for k in MESH):
        _mesh_rule([env.get(f"PARALLELISM_CONFIG_{k.upper()}_SIZE", 1) for k in MESH], env.get("WORLD_SIZE"),
                   "PARALLELISM_CONFIG_DP_*_SIZE", add)


def fix_fsdp(cfg: dict) -> None:
    """In place: the values of `GOOD` for every FSDP key that a rule flags; an fsdp_config nothing reads removed."""
    fsdp = cfg.get("fsdp_config")
    if cfg.get("distributed_type") != "FSDP":
        cfg.pop("fsdp_config", None)  # read by nothing
        return
    if not isinstance(fsdp, dict):
        return
    flagged = []
    _rules(fsdp.get, None, lambda key, *rest: flagged.append(key))
    fsdp.update({k: GOOD[k] for k in flagged})


def launch_engine(env) -> str:
    """'fsdp2', 'deepspeed' or 'none': the engine `accelerate launch` exported (ACCELERATE_USE_FSDP/_DEEPSPEED)."""
    if truthy(env.get("ACCELERATE_USE_FSDP")):
        return "fsdp2"
    return "deepspeed" if truthy(env.get("ACCELERATE_USE_DEEPSPEED")) else "none"


def train_conflicts(fsdp: bool, train: dict, deepspeed: bool = False, processes: int = 1) -> list[tuple[str, str]]:
    """(key, what it must be) for each yxanul train setting that this launch cannot run: under FSDP2, CUDA
    graphs and fp32 master weights; outside it, the FP8 weight all-gather; under FSDP2 or DeepSpeed, the grouped
    QKV weight of fuse_qkv_rope; fp32 master weights under DeepSpeed or with ``processes`` > 1 (DDP). ``train``: the
    config's values (missing keys: their defaults). One rule for the
    start-up check (training/launch.py, a ConfigError) and `yxanul lint-config --train_config` (an error line)."""
    out = []
    if (fsdp or deepspeed) and truthy(train.get("fuse_qkv_rope")):
        out.append(("fuse_qkv_rope", f"false under {'FSDP2' if fsdp else 'DeepSpeed'} (its checkpoints keep the "
                    "fused QKV weight by parameter name, where the readers expect cat[q, k, v] rows, not the "
                    "grouped rows of fuse_qkv_rope; fuse_qkv_params is the fused weight they read)"))
    if fsdp and truthy(train.get("cuda_graphs")):
        out.append(("cuda_graphs", "false under FSDP2 (each block's weights are gathered before and freed after its "
                                   "forward: a captured graph would replay on freed memory)"))
    if fsdp and train.get("master_weights") == "fp32":
        out.append(("master_weights", "none under FSDP2 (its mixed precision is this scheme, sharded: fp32 "
                                      "parameters, BF16 all-gather and compute)"))
    if deepspeed and train.get("master_weights") == "fp32":
        out.append(("master_weights", "none under DeepSpeed (its bf16 mode keeps fp32 masters itself)"))
    if not (fsdp or deepspeed) and processes > 1 and train.get("master_weights") == "fp32":
        out.append(("master_weights", f"none with {processes} processes (DDP): master weights run in one process "
                                      "only (FSDP2 and DeepSpeed keep fp32 masters themselves)"))
    if not fsdp and truthy(train.get("fp8_weight_all_gather")):
        out.append(("fp8_weight_all_gather", "false outside an FSDP2 launch (the FP8 weights are what FSDP2 "
                    "all-gathers: accelerate launch --config_file accelerate_configs/fsdp2.yaml ...)"))
    return out

