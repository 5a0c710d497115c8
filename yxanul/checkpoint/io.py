"""Checkpoint file I/O: atomic text writes and directory fsyncs (the commit steps of a save), and
loading and saving model weights inside accelerate's save_state/load_state: the pre-hooks that keep
TE's fused q/k/v views intact, and `load_for_resume` with its one-line shape-mismatch error."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import yaml

from ..errors import EveryRankError, UserError

SHARDED_MODEL_DIR = "pytorch_model_fsdp_0"  # accelerate's FSDP_MODEL_NAME + model index, a DCP folder
SHARDED_OPTIMIZER_DIR = "optimizer_0"  # accelerate's OPTIMIZER_NAME + optimizer index (FSDP2), a DCP folder
MASTER = ".master_param"  # TE FusedAdam's fp32 master of a parameter, under optimizer.state.<name>


def saved_config(folder) -> dict:
    """The flat config a run directory or a checkpoint was written with (its ``config.yaml``); {} without one."""
    path = Path(folder) / "config.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def weights_mode_like(path: Path, sibling: Path) -> None:
    """Give a weights file the permissions of ``sibling``, a file of the same folder: safetensors (and
    huggingface_hub through it) writes through a private temporary file, mode 0600, while the other files of a
    checkpoint or export follow the umask (0644 under 022), so others who may read the folder could not load it."""
    os.chmod(path, stat.S_IMODE(Path(sibling).stat().st_mode))


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def file_in_the_way(path) -> Path | None:
    """The nearest existing one of ``path`` and its parents when it is a file, not a folder (nothing can be made
    there: one line naming it beats mkdir's NotADirectoryError), else None."""
    path = Path(path)
    existing = next((p for p in (path, *path.absolute().parents) if p.exists()), None)
    return existing if existing is not None and not existing.is_dir() else None


def load_for_resume(accelerator, ckpt: Path, cfg) -> None:
    """`accelerator.load_state`, with one line naming the model settings that differ from the
    checkpoint's ``config.yaml`` when its weights do not fit this model."""
    import pickle

    _check_same_optimizer(ckpt, cfg)
    _check_same_layout(ckpt, str(getattr(accelerator.distributed_type, "value", accelerator.distributed_type)))
    handle = accelerator.register_load_state_pre_hook(_load_models_with_views)
    try:
        _check_random_states(ckpt)
        accelerator.load_state(str(ckpt))
    except pickle.UnpicklingError as e:  # torch.load(weights_only=True) met a pickle that would run code
        if "global" not in str(e).lower():  # not an import of code: a damaged file
            raise UserError(f"resume '{ckpt}': a state file is not a readable torch file ({str(e)[:80]})") from None
        what = next((line.strip() for line in str(e).splitlines() if "GLOBAL" in line or "Unsupported" in line), "")
        raise UserError(f"resume '{ckpt}': a file holds a pickle that would run code; refused, nothing was "
                        f"executed ({what[:160]})") from None
    except Exception as e:  # noqa: BLE001 - DeepSpeed's own exception class, without importing DeepSpeed
        if type(e).__name__ == "ZeRORuntimeException" and "world size" in str(e):  # the same on every rank
            raise EveryRankError(_zero_world_size_line(ckpt, str(e))) from None
        if not isinstance(e, RuntimeError) or "state_dict" not in str(e):
            raise
        import dataclasses

        theirs = saved_config(ckpt)
        ours = cfg.to_flat_dict()
        diff = [f"{f.name}: {theirs[f.name]!r} -> {ours.get(f.name)!r}" for f in dataclasses.fields(cfg.model)
                if f.name in theirs and theirs[f.name] != ours.get(f.name)]
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        first = lines[1] if len(lines) > 1 and lines[0].endswith(":") else lines[0]  # torch's header line
        first = first if len(first) <= 300 else first[:297] + "..."
        raise UserError(f"resume '{ckpt}': its weights do not fit this model ("
                        + ("; ".join(diff) if diff else first) + ")") from None
    finally:
        handle.remove()


DS_MODEL_DIR = "pytorch_model"  # accelerate's DeepSpeed tag folder: DeepSpeed's own model and ZeRO shards


def layout_of(ckpt) -> str:
    """How a checkpoint holds the model: 'FSDP' (DCP shards, or a full state dict's pytorch_model_fsdp.bin),
    'DEEPSPEED' (DeepSpeed's folder) or 'plain'."""
    if is_sharded_checkpoint(ckpt) or any(Path(ckpt).glob("pytorch_model_fsdp*")):
        return "FSDP"
    return "DEEPSPEED" if (Path(ckpt) / DS_MODEL_DIR).is_dir() else "plain"


def _check_same_layout(ckpt, distributed_type: str) -> None:
    """accelerate's load_state reads the layout of the launch's engine: another one's files are not there (a
    FileNotFoundError per rank, after the process group exists). One line for the job (every rank finds it in the
    same files: rank 0 prints it), with the way out."""
    ours = distributed_type if distributed_type in ("FSDP", "DEEPSPEED") else "plain"
    theirs = layout_of(ckpt)
    if theirs != ours:
        names = {"FSDP": "FSDP2 (sharded)", "DEEPSPEED": "DeepSpeed", "plain": "a single process or DDP"}
        raise EveryRankError(f"resume '{ckpt}': written under {names[theirs]}, this launch is {names[ours]}: "
                             "relaunch with the accelerate profile it was trained with, or start a new run from its "
                             f"weights (`yxanul export {ckpt} OUT`, then --init_from OUT)")


def _check_same_optimizer(ckpt, cfg) -> None:
    """``fp8_weight_all_gather`` decides the optimizer (TE's FusedAdam with fp32 masters, else AdamW) and
    what the model shards hold: a resume keeps the checkpoint's value."""
    theirs = bool(saved_config(ckpt).get("fp8_weight_all_gather"))
    ours = cfg.precision.fp8_weight_all_gather
    if theirs != ours:
        raise EveryRankError(f"resume '{ckpt}': written with fp8_weight_all_gather {str(theirs).lower()}, this run "
                             f"has {str(ours).lower()}: the optimizer state differs (FusedAdam with fp32 masters vs "
                             f"AdamW); resume with --fp8_weight_all_gather {str(theirs).lower()}")


def _zero_world_size_line(ckpt, msg: str) -> str:
    import re

    m = re.search(r"DP world size of (\d+) but the current world size is (\d+)", msg)
    saved, now = m.groups() if m else ("another", "this")
    return (f"resume '{ckpt}': its DeepSpeed ZeRO state was sharded over {saved} processes and DeepSpeed "
            f"reloads it only at that world size (this run has {now}): relaunch with --num_processes {saved}, "
            f"or `yxanul export {ckpt} OUT --dtype fp32` and start a new run with --init_from OUT (fresh optimizer)")


def own_storage_for_views(models: list, weights: list, output_dir: str) -> None:
    """accelerate's save-state pre-hook: give every tensor that is a *part* of a larger storage a
    storage of its own, in the state dicts about to be written.

    Before safetensors, accelerate drops every tensor that shares a storage with an earlier one
    (``clean_state_dict_for_safetensors``), meant for tied weights. TE's ``query_weight``,
    ``key_weight`` and ``value_weight`` are views of one fused buffer, so ``key_weight`` and
    ``value_weight`` were silently left out of every TE checkpoint. A tied head is the same whole
    tensor as the embedding: it is left shared and dropped as intended (the load restores it)."""
    import torch

    for state in weights:
        for name, t in state.items():
            if isinstance(t, torch.Tensor) and t.device.type != "meta" and t.numel() and (
                    t.data_ptr() != t.untyped_storage().data_ptr()
                    or t.numel() * t.element_size() != t.untyped_storage().nbytes()):
                state[name] = t.clone()


def _load_models_with_views(models: list, input_dir: str) -> None:
    """accelerate's load-state pre-hook: load each ``model[_i].safetensors`` ourselves and take the
    models off accelerate's list (the hook's documented use).

    accelerate loads with ``safetensors.torch.load_model``, which refuses any parameter that is a view
    into a larger storage ("None is covering the entire storage"). TE's ``LayerNormLinear`` with
    ``parameters_split`` registers ``query_weight``/``key_weight``/``value_weight`` as views of ONE
    fused buffer, so no TE checkpoint could be loaded that way (checked on an H100).
    ``load_state_dict`` copies into the views in place. Missing keys are forgiven only where the
    model's own state dict aliases them to a loaded tensor (a tied head that the save dropped) or
    they are TE ``_extra_state`` (the model's load hooks); anything else raises, as strict loading does.
    """
    from safetensors.torch import load_file

    paths = [Path(input_dir) / f"model{'_' + str(i) if i else ''}.safetensors" for i in range(len(models))]
    if not all(p.is_file() for p in paths):
        return  # accelerate's own fallback (pytorch_model.bin) for all of them: the file names
        #       # follow the list positions, so take none off
    for model, path in zip(models, paths):
        device = next((t.device for t in model.parameters() if t.device.type != "meta"), "cpu")
        state = load_file(str(path), device=str(device))
        missing, unexpected = load_tolerant(model, state)
        if missing or unexpected:
            raise RuntimeError(f"Error(s) in loading state_dict for {type(model).__name__}: "
                               f"missing keys {missing[:5]}, unexpected keys {list(unexpected)[:5]}")
    models.clear()


def _check_random_states(ckpt) -> None:
    """accelerate's load_state swallows ANY error loading ``random_states_*.pkl`` (a garbage or
    refused file resumed silently with fresh RNG, so not exactly). Load them first, with torch's
    weights-only unpickler (a pickle that would run code raises UnpicklingError, caught above), through
    accelerate's own ``load`` so that the same allow-list (numpy RNG state) applies as in load_state."""
    import pickle

    from accelerate.utils import load

    for f in sorted(Path(ckpt).glob("random_states_*.pkl")):
        try:
            load(f, map_location="cpu")
        except pickle.UnpicklingError:
            raise
        except Exception as e:  # noqa: BLE001 - any unreadable file is one line
            raise UserError(f"resume '{ckpt}': {f.name} is unreadable ({type(e).__name__}); the run cannot resume "
                            "exactly from it") from None


def is_sharded_checkpoint(ckpt) -> bool:
    """An FSDP2 checkpoint: accelerate saved the model as torch.distributed.checkpoint shards."""
    return (Path(ckpt) / SHARDED_MODEL_DIR).is_dir()


def read_sharded_weights(ckpt, stepped_master) -> dict:
    """The full model state dict of a sharded (FSDP2, torch.distributed.checkpoint) checkpoint, read in
    this one process without a process group (accelerate's own merge reader). Where the optimizer shards
    hold fp32 masters of TE GEMM weights (``fp8_weight_all_gather``: the model shards hold those FP8-rounded,
    stored as TE tensor objects), the weight is its master, and its model entry is not read. TE's FusedAdam
    keeps a master of every parameter but steps only those of quantized weights: an fp32 parameter (embedding,
    norms) is stepped in place and its master keeps the value of the first step, so those come from the model
    shards: ``stepped_master(name)`` says which names' masters are trained (the models layer's
    `is_te_gemm_weight`). A fused QKV weight (``fuse_qkv_params``: FSDP2 saves it fused) stays fused here: the
    readers above this layer split it (`yxanul.models.state_dict.split_qkv_state`)."""

    def trained_master(key: str) -> bool:
        return key.endswith(MASTER) and stepped_master(key.removeprefix("optimizer.state.").removesuffix(MASTER))

    masters = {k.removeprefix("optimizer.state.").removesuffix(MASTER): v
               for k, v in _read_dcp(Path(ckpt) / SHARDED_OPTIMIZER_DIR, trained_master).items()}
    state = _read_dcp(Path(ckpt) / SHARDED_MODEL_DIR, lambda k: k.removeprefix("model.") not in masters)
    return {**{k.removeprefix("model."): v for k, v in state.items()}, **masters}


def _read_dcp(folder: Path, wanted) -> dict:
    """The flat entries (DCP's dotted keys) of a torch.distributed.checkpoint folder that ``wanted(key)``
    accepts, read without a process group; {} when the folder is absent."""
    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint.format_utils as fmt

    if not folder.is_dir():
        return {}
    reader = dcp.FileSystemReader(str(folder))
    keys = {k for k in reader.read_metadata().state_dict_metadata if wanted(k)}
    if not keys:
        return {}
    state: dict = {}
    # as accelerate.utils.fsdp_utils._distributed_checkpoint_to_merged_weights reads it
    fmt._load_state_dict(state, storage_reader=reader, planner=fmt._EmptyStateDictLoadPlanner(keys=keys),
                         no_dist=True)
    return _flatten(state)


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def load_tolerant(model, state: dict) -> tuple[list[str], list[str]]:
    """THE tolerant load, for a checkpoint resume, ``--init_from`` and the readers of checkpoints:
    ``load_state_dict(strict=False)`` copies into the model's own tensors (TE's q/k/v parameters are views
    of one fused buffer, which safetensors' ``load_model`` refuses), then it is strict about the rest: a key
    absent from ``state`` is forgiven only where the model's state dict aliases it to a tensor that was
    loaded (a tied head the save dropped as a duplicate); TE's ``*_extra_state`` is the load hooks' business.
    Returns (missing, unexpected) for the caller to word its one-line error; a shape mismatch raises
    torch's RuntimeError."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    own = model.state_dict()
    loaded = {own[k].data_ptr() for k in state if k in own}
    # data_ptr 0: no storage of its own (a TE FP8 weight, a wrapper tensor subclass), never an alias
    return [k for k in missing if own[k].data_ptr() == 0 or own[k].data_ptr() not in loaded], list(unexpected)

