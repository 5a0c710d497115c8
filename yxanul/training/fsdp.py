"""FSDP2 (``fully_shard``) through accelerate: the plugin yxanul builds from what `accelerate launch`
exported (``accelerate_configs/fsdp2*.yaml``), and the CPU process groups accelerate leaves out.

What yxanul sets on accelerate's own FullyShardedDataParallelPlugin (read from ``FSDP_*``):
- the layers to shard one by one: the decoder-layer class the model really has. accelerate's
  TRANSFORMER_BASED_WRAP would take ``_no_split_modules`` (the torch AND the TE layer class) and raise
  for the one a model does not contain;
- the mixed-precision policy: BF16 compute (params all-gathered in bf16) with fp32 gradient
  reduce-scatter. accelerate's ``set_mixed_precision("bf16")`` would reduce in bf16 too, and no
  ``FSDP_*`` variable can say otherwise. fp32 runs keep accelerate's default (no casts).

CPU: accelerate 1.15 sets ``DistributedType.FSDP`` only when the process group is a GPU type
(``AcceleratorState.__init__``: MULTI_GPU/NPU/XPU/...); on a gloo group it stays MULTI_CPU and
``prepare`` would train plain data parallel. torch's ``fully_shard`` itself runs on CPU over gloo, so
`shard_on_cpu` sets the two fields accelerate would have set on a GPU (``distributed_type`` and
``fsdp_plugin``) and everything after -- ``prepare`` (``fsdp2_prepare_model``, activation
checkpointing), ``clip_grad_norm_``, ``save_state``/``load_state`` (torch.distributed.checkpoint, one
shard per rank) -- is accelerate's GPU code path, unchanged. That is how the CPU tests exercise it.

Order (`prepare`): yxanul shards the model first, with accelerate's own ``fsdp2_apply_ac`` and
``fsdp2_prepare_model`` (the same units, tail and root, precision policy and activation checkpointing
that ``Accelerator.prepare`` would apply), then builds the optimizer over the sharded parameters, then
calls ``prepare``, which sees a sharded model and leaves it. Inside ``prepare`` accelerate re-maps the
optimizer's parameters to the sharded ones by ``data_ptr()``, and TE's FP8 weights
(``fp8_weight_all_gather``: Float8Tensor, a wrapper tensor subclass) all report ``data_ptr() == 0``:
the map would send every FP8 weight's slot to one of them, silently. Built after sharding, the
optimizer already holds the right parameters; `prepare` puts them back after accelerate's re-map.

Checkpoints of FP8 weights: accelerate's sharded state-dict config offloads to the CPU by default, so
``load_state`` builds the model's state dict as CPU copies and DCP's read copies each loaded
Float8Tensor into one; TE's ``Float8Tensor.copy_`` then runs its CUDA transpose kernel on that CPU
memory (an illegal memory access, H200, TE 2.20.2). With ``offload_to_cpu=False`` the state dict is the
sharded GPU parameters themselves, as in TE's own FSDP2 DCP test (``run_fsdp2_fused_adam.py``).
"""

from __future__ import annotations

import contextlib
import os

from .. import _te
from ..errors import ConfigError, UserError
from ..models.build import read_weights
from ..models.state_dict import fused_qkv_state


def fsdp_requested(env=os.environ) -> bool:
    return env.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def decoder_layer_classes(model) -> list[str]:
    """The class names of ``_no_split_modules`` that this model contains (its decoder layers)."""
    present = {type(m).__name__ for m in model.modules()}
    return [n for n in getattr(model, "_no_split_modules", None) or () if n in present]


def fsdp_plugin(model, base: str, fp8_weights: bool = False):
    """accelerate's FullyShardedDataParallelPlugin from the ``FSDP_*`` environment with yxanul's wrap
    classes and precision policy (module doc) for a ``base`` ("bf16"/"fp32") run; None when no FSDP profile
    was launched. ``fp8_weights`` (TE FP8 weights, ``fp8_weight_all_gather``): checkpoints' model state stays
    on the GPU (module doc)."""
    if not fsdp_requested():
        return None
    import torch
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import MixedPrecisionPolicy, ShardedStateDictConfig, StateDictType

    version = os.environ.get("FSDP_VERSION", "1")
    if version != "2":
        raise UserError(f"fsdp_version {version}: yxanul trains with FSDP2 only (fully_shard: sharded "
                        "checkpoints, TE FP8); set fsdp_version: 2 (accelerate_configs/fsdp2.yaml)")
    plugin = FullyShardedDataParallelPlugin()
    plugin.transformer_cls_names_to_wrap = decoder_layer_classes(model) or None
    if base != "fp32":
        plugin.mixed_precision_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if fp8_weights:
        if plugin.state_dict_type != StateDictType.SHARDED_STATE_DICT:
            raise ConfigError("fsdp_state_dict_type", "SHARDED_STATE_DICT with fp8_weight_all_gather (a full state "
                                                      "dict is gathered on the CPU, where TE's FP8 kernels cannot run)",
                              plugin.state_dict_type.name)
        plugin.state_dict_config = ShardedStateDictConfig(offload_to_cpu=False)
    return plugin


@contextlib.contextmanager
def mesh_after_fsdp_on_cpu(plugin, cpu: bool):
    """Around ``Accelerator(...)`` on CPU under an HSDP profile: yields whether accelerate's
    ``ACCELERATE_USE_PARALLELISM_CONFIG`` was hidden from it. accelerate validates the parallelism config
    inside ``Accelerator.__init__`` and refuses it for a MULTI_CPU state, before `shard_on_cpu` can set
    FSDP; `shard_on_cpu` then builds the same config and mesh, after FSDP is on."""
    key = "ACCELERATE_USE_PARALLELISM_CONFIG"
    hide = plugin is not None and cpu and os.environ.get(key, "false").lower() == "true"
    saved = os.environ.pop(key) if hide else None
    try:
        yield hide
    finally:
        if saved is not None:
            os.environ[key] = saved


def shard_on_cpu(accelerator, plugin, deferred_mesh: bool = False) -> None:
    """On a CPU (gloo) process group, turn FSDP on the way accelerate does for GPU groups (module doc);
    ``deferred_mesh``: then build the HSDP mesh as ``Accelerator.__init__`` does (`mesh_after_fsdp_on_cpu`)."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, ParallelismConfig

    if plugin is None or accelerator.distributed_type != DistributedType.MULTI_CPU:
        return
    state = accelerator.state
    state.fsdp_plugin = plugin
    state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # what AcceleratorState.__init__ sets
    if deferred_mesh:
        pc = ParallelismConfig()  # from PARALLELISM_CONFIG_*, as Accelerator.__init__ builds it
        state.parallelism_config = pc
        state.device_mesh = pc.get_device_mesh(accelerator.device.type)
        pc._validate_accelerator(accelerator)


def fp32_values(model, init_from: str | None = None) -> dict:
    """name -> full fp32 value of each FP8 weight, for its master: TE's pre-quantization value, or with
    ``init_from`` the loaded weight (the model's copy went through FP8 rounding; read a second time)."""
    values = _te.take_fp32_init_values(model)
    if init_from and values:
        loaded = fused_qkv_state(read_weights(init_from, model))  # the model's own names (fused QKV)
        values = {name: loaded[name].float() for name in values}  # every name: load_weights was strict
    return values


def prepare(accelerator, model, make_optimizer, fp32_values: dict | None = None):
    """FSDP2: shard ``model``, build ``make_optimizer(model)`` over its shards, ``accelerator.prepare`` both
    (module doc); ``fp32_values`` (name -> full fp32 tensor, FP8 weights): seed the optimizer's masters."""
    from accelerate.utils.fsdp_utils import fsdp2_apply_ac, fsdp2_prepare_model

    plugin = accelerator.state.fsdp_plugin
    plugin.set_auto_wrap_policy(model)
    if plugin.activation_checkpointing:
        model = fsdp2_apply_ac(accelerator, model)
    model = fsdp2_prepare_model(accelerator, model)
    optimizer = make_optimizer(model)
    params = [list(g["params"]) for g in optimizer.param_groups]
    ac, plugin.activation_checkpointing = plugin.activation_checkpointing, False  # applied above, once
    try:
        model, optimizer = accelerator.prepare(model, optimizer)
    finally:
        plugin.activation_checkpointing = ac
    for group, own in zip(optimizer.optimizer.param_groups, params, strict=True):
        group["params"] = own  # undo the data_ptr re-map (module doc)
    mine = {id(p) for p in model.parameters()}
    if not all(id(p) in mine for g in params for p in g):
        raise RuntimeError("FSDP2: the optimizer holds parameters the sharded model does not")
    if fp32_values:
        named = ((n.replace("._checkpoint_wrapped_module", ""), p) for n, p in model.named_parameters())
        _te.seed_fp32_masters(optimizer.optimizer, named, fp32_values)
        _te.initialize_every_state(optimizer.optimizer)  # what a resume loads is what exists
    return model, optimizer


def _dtype(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def sharding_facts(accelerator, fp8_weights: bool = False) -> dict:
    """What the precision report records of an FSDP2 run: the mesh and the dtypes the weights are
    all-gathered and the gradients reduce-scattered in. Without ``fp8_weights`` TE quantizes the gathered
    BF16 weights in each GEMM; with them the TE layers' weights travel as FP8 (the rest as BF16)."""
    plugin, pc = accelerator.state.fsdp_plugin, accelerator.parallelism_config
    mp = plugin.mixed_precision_policy
    hsdp = pc is not None and pc.dp_replicate_enabled
    gathered = _dtype(mp.param_dtype) if mp is not None and mp.param_dtype is not None else "float32"
    return {"strategy": "hsdp" if hsdp else "fsdp2", "processes": accelerator.num_processes,
            "replicate": pc.dp_replicate_size if hsdp else 1,
            "shard": pc.dp_shard_size if hsdp else accelerator.num_processes,
            "units": list(plugin.transformer_cls_names_to_wrap or []),
            "weight_all_gather": f"float8 (TE layers), {gathered} (the rest)" if fp8_weights else gathered,
            "gradient_reduce": _dtype(mp.reduce_dtype) if mp is not None and mp.reduce_dtype is not None
            else gathered, "reshard_after_forward": bool(plugin.reshard_after_forward),
            "activation_checkpointing": bool(plugin.activation_checkpointing)}


def describe(facts: dict) -> str:
    """One start-up line of `sharding_facts`."""
    mesh = (f"HSDP: replicated over {facts['replicate']} x sharded over {facts['shard']}"
            if facts["strategy"] == "hsdp" else f"sharded over {facts['shard']}")
    return (f"FSDP2 (fully_shard): {mesh} processes, one unit per {', '.join(facts['units']) or '(none)'} + root"
            f" | all-gather {facts['weight_all_gather']}, reduce {facts['gradient_reduce']}"
            f" | reshard_after_forward {facts['reshard_after_forward']} | activation checkpointing "
            f"{'on' if facts['activation_checkpointing'] else 'off'} | checkpoints: one shard per rank")
