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
"""

from __future__ import annotations

import os

from ..errors import UserError

SHARDED_MODEL_DIR = "pytorch_model_fsdp_0"  # accelerate's FSDP_MODEL_NAME + model index, a DCP folder
SHARDED_OPTIM_DIR = "optimizer_0"


def fsdp_requested(env=os.environ) -> bool:
    return env.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def decoder_layer_classes(model) -> list[str]:
    """The class names of ``_no_split_modules`` that this model contains (its decoder layers)."""
    present = {type(m).__name__ for m in model.modules()}
    return [n for n in getattr(model, "_no_split_modules", None) or () if n in present]


def fsdp_plugin(plan, model):
    """accelerate's FullyShardedDataParallelPlugin from the ``FSDP_*`` environment with yxanul's wrap
    classes and precision policy (module doc); None when no FSDP profile was launched."""
    if not fsdp_requested():
        return None
    import torch
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import MixedPrecisionPolicy

    version = os.environ.get("FSDP_VERSION", "1")
    if version != "2":
        raise UserError(f"fsdp_version {version}: yxanul trains with FSDP2 only (fully_shard: sharded "
                        "checkpoints, TE FP8); set fsdp_version: 2 (accelerate_configs/fsdp2.yaml)")
    plugin = FullyShardedDataParallelPlugin()
    plugin.transformer_cls_names_to_wrap = decoder_layer_classes(model) or None
    if plan.base != "fp32":
        plugin.mixed_precision_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return plugin


def shard_on_cpu(accelerator, plugin) -> None:
    """On a CPU (gloo) process group, turn FSDP on the way accelerate does for GPU groups (module doc)."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    if plugin is None or accelerator.distributed_type != DistributedType.MULTI_CPU:
        return
    state = accelerator.state
    state.fsdp_plugin = plugin
    state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # what AcceleratorState.__init__ sets


def _dtype(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def describe(accelerator) -> str:
    """One start-up line: what is sharded over what, and with which settings."""
    plugin, pc = accelerator.state.fsdp_plugin, accelerator.parallelism_config
    mesh = (f"HSDP: replicated over {pc.dp_replicate_size} x sharded over {pc.dp_shard_size}"
            if pc is not None and pc.dp_replicate_enabled else f"sharded over {accelerator.num_processes}")
    mp = plugin.mixed_precision_policy
    dtypes = (f"params {_dtype(mp.param_dtype)}, reduce {_dtype(mp.reduce_dtype)}"
              if mp is not None and mp.param_dtype is not None else "fp32 throughout")
    units = ", ".join(plugin.transformer_cls_names_to_wrap or ["(none)"])
    return (f"FSDP2 (fully_shard): {mesh} processes, one unit per {units} + root | {dtypes} | "
            f"reshard_after_forward {plugin.reshard_after_forward} | activation checkpointing "
            f"{'on' if plugin.activation_checkpointing else 'off'} | checkpoints: one shard per rank")


def is_sharded_checkpoint(ckpt) -> bool:
    from pathlib import Path

    return (Path(ckpt) / SHARDED_MODEL_DIR).is_dir()


def read_sharded_weights(ckpt) -> dict:
    """The full model state dict of a sharded (FSDP2, torch.distributed.checkpoint) checkpoint, read in
    this one process without a process group (accelerate's own merge reader)."""
    from pathlib import Path

    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint.format_utils as fmt

    state: dict = {}
    # as accelerate.utils.fsdp_utils._distributed_checkpoint_to_merged_weights reads it
    fmt._load_state_dict(state, storage_reader=dcp.FileSystemReader(str(Path(ckpt) / SHARDED_MODEL_DIR)),
                         planner=fmt._EmptyStateDictLoadPlanner(), no_dist=True)
    return state.get("model", state)
