"""The ONLY module of yxanul that imports Transformer Engine.

`import transformer_engine` raises RuntimeError (not ImportError) when CUDA libraries are missing,
so any exception means "not available" and is kept as the reason.
"""

from __future__ import annotations

import os

from .errors import ConfigError

TE_AVAILABLE = False
TE_IMPORT_ERROR: str | None = None
te = None          # transformer_engine.pytorch
te_recipe = None   # transformer_engine.common.recipe
parallel_cross_entropy = None  # transformer_engine.pytorch.cross_entropy.parallel_cross_entropy (TE >= 2.x)
fused_qkv_rope = None  # transformer_engine.pytorch.attention.rope.apply_fused_qkv_rotary_pos_emb (in TE 2.20)
te_version: str | None = None


def _installed_version() -> str | None:
    """The installed distribution's version, even when the import fails (no import happens)."""
    from importlib import metadata

    for dist in ("transformer-engine", "transformer_engine", "transformer-engine-torch"):
        try:
            return metadata.version(dist)
        except Exception:  # noqa: BLE001
            continue
    return None


te_installed_version = _installed_version()

try:  # pragma: no cover - exercised on GPU machines with TE
    # torch first: libtransformer_engine.so needs libnccl.so.2, which only torch's CUDA libraries
    # (RPATH into nvidia/nccl/lib) put in the process; `import transformer_engine` first fails with
    # "OSError: libnccl.so.2: cannot open shared object file" wherever NCCL is not on the system path.
    import torch  # noqa: F401
    import transformer_engine
    import transformer_engine.pytorch as te
    from transformer_engine.common import recipe as te_recipe  # noqa: F401 (module attribute)

    te_version = getattr(transformer_engine, "__version__", "unknown")
    TE_AVAILABLE = True
    try:  # Triton kernel: fp32 CE on BF16 logits, gradient written in place (loss_impl "te")
        from transformer_engine.pytorch.cross_entropy import parallel_cross_entropy
    except Exception:  # noqa: BLE001 - an older TE without it, or no Triton
        parallel_cross_entropy = None
    try:  # q and k rotated, v copied out, from one packed QKV projection: one kernel each way (fuse_qkv_rope)
        from transformer_engine.pytorch.attention.rope import apply_fused_qkv_rotary_pos_emb as fused_qkv_rope
    except Exception:  # noqa: BLE001 - an older TE without it
        fused_qkv_rope = None
except Exception as e:  # noqa: BLE001 - RuntimeError when cuDNN/CUDA libs are missing
    TE_IMPORT_ERROR = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"


def cudnn_runtime() -> str | None:
    """The cuDNN that TE's fused attention runs on, as "9.14.0" (None without TE). TE loads its own:
    ``_load_cuda_library("cudnn")`` prefers a system libcudnn over the pip one torch was built against, so it can
    differ from torch's, and then ``torch.backends.cudnn.version()`` raises. Never raises itself."""
    if not TE_AVAILABLE:
        return None
    try:  # pragma: no cover - TE on a GPU machine
        from transformer_engine.pytorch.utils import get_cudnn_version

        return ".".join(map(str, get_cudnn_version()))
    except Exception as e:  # noqa: BLE001 - a record of the environment, not a check
        return f"unknown ({type(e).__name__})"


def autocast(enabled: bool = True, recipe=None):
    """`te.autocast` (TE >= 2.9) or the deprecated `te.fp8_autocast` on older TE. A new instance per
    call: TE's class-based context refuses concurrent re-entry of one instance. Nested contexts:
    the innermost wins (autocast_enter overwrites the global state, __exit__ restores it)."""
    if hasattr(te, "autocast"):
        return te.autocast(enabled=enabled, recipe=recipe)
    return te.fp8_autocast(enabled=enabled, fp8_recipe=recipe)


def _state_manager():
    for mod in ("transformer_engine.pytorch.quantization", "transformer_engine.pytorch.fp8"):
        try:
            return __import__(mod, fromlist=["FP8GlobalStateManager"]).FP8GlobalStateManager
        except Exception:  # noqa: BLE001
            continue
    return None


def fp8_state() -> tuple[bool, object]:
    """(FP8 enabled right now, the recipe in effect) as TE itself sees it: call inside a forward."""
    mgr = _state_manager()
    if mgr is None:
        return False, None
    enabled = bool(mgr.is_fp8_enabled())
    return enabled, (mgr.get_fp8_recipe() if enabled else None)


def reset_fp8_state() -> None:
    """Forget TE's global FP8 state (amax buffers, autocast bookkeeping), e.g. between benchmark cases."""
    mgr = _state_manager() if TE_AVAILABLE else None
    if mgr is not None and hasattr(mgr, "reset"):
        mgr.reset()


def availability() -> dict[str, tuple[bool, str]]:
    """Per recipe: (available, TE's reason)."""
    out: dict[str, tuple[bool, str]] = {}
    if not TE_AVAILABLE:
        return {r: (False, f"Transformer Engine not importable ({TE_IMPORT_ERROR})")
                for r in ("delayed", "current", "block", "mxfp8")}

    def call(name):
        fn = getattr(te, name, None)
        if fn is None:
            return False, f"this TE has no {name}()"
        try:
            res = fn(return_reason=True)
        except TypeError:
            res = (fn(), "")
        except Exception as e:  # noqa: BLE001
            return False, f"{type(e).__name__}: {e}"
        return (bool(res[0]), str(res[1] or "")) if isinstance(res, tuple) else (bool(res), "")

    out["delayed"] = out["current"] = call("is_fp8_available")
    out["block"] = call("is_fp8_block_scaling_available")
    out["mxfp8"] = call("is_mxfp8_available")
    return out


def make_graphed_callables(modules: tuple, sample_args: tuple, *, enabled: bool, recipe, cache_weights: bool):
    """`te.make_graphed_callables` (CUDA graphs of TE modules, FP8-aware): each module's ``forward`` is
    replaced by a graph replay while its training flag equals the captured one. The FP8 keywords were
    renamed in TE 2.x (``fp8_enabled``/``fp8_recipe``/``fp8_weight_caching`` -> ``enabled``/``recipe``/
    ``cache_quantized_params``): whichever this TE has. With weight caching, every call must pass
    ``is_first_microbatch`` as a bool."""
    import inspect

    params = inspect.signature(te.make_graphed_callables).parameters
    kwargs = {}
    for (new, old), value in zip((("enabled", "fp8_enabled"), ("recipe", "fp8_recipe"),
                                  ("cache_quantized_params", "fp8_weight_caching")), (enabled, recipe, cache_weights)):
        kwargs[new if new in params else old] = value
    return te.make_graphed_callables(modules, sample_args, **kwargs)


def quantized_model_init(recipe):
    """TE modules built inside hold FP8 weights only (``primary_weights_in_fp8``), quantized with
    ``recipe``, each keeping its pre-quantization fp32 value on the host for the optimizer's master
    (``preserve_high_precision_init_val``). TE >= 2.9 ``quantized_model_init``, else ``fp8_model_init``."""
    fn = getattr(te, "quantized_model_init", None) or te.fp8_model_init
    return fn(enabled=True, recipe=recipe, preserve_high_precision_init_val=True)


def is_quantized(tensor) -> bool:
    """A TE quantized tensor (e.g. a Float8Tensor weight), or a DTensor whose local shard is one."""
    local = getattr(tensor, "_local_tensor", tensor)
    cls = getattr(te, "QuantizedTensor", None) if TE_AVAILABLE else None
    return cls is not None and isinstance(local, cls)


def fused_adam_with_masters(groups, *, lr: float, betas: tuple, eps: float):
    """TE's FusedAdam (decoupled weight decay, as torch's AdamW) keeping an fp32 master of every
    parameter: an FP8 weight cannot take an Adam update itself (3 mantissa bits), so the step updates
    the master and re-quantizes the weight from it. Handles FSDP2's DTensor parameters and states."""
    import torch

    return te.optimizers.FusedAdam(groups, lr=lr, betas=betas, eps=eps, adam_w_mode=True, master_weights=True,
                                   master_weight_dtype=torch.float32)


def initialize_every_state(optimizer) -> int:
    """FusedAdam's state for every parameter that has none, as its first step would make it (zero moments, a
    master from the parameter). torch's ``get_optimizer_state_dict`` lists only the states that exist and a
    resume (accelerate's DCP load) fills only what it lists: a parameter without one (the embedding and norms,
    which `seed_fp32_masters` leaves alone) would resume with fresh moments, silently. Returns states made.
    FusedAdam counts its steps in each group (``group["step"]``, made at its first step); a resume loads only the
    keys the optimizer's own state dict lists, so without the key the saved count was never read and the first
    resumed step bias-corrected as step 1 (the 2026-11-27.4 H200 run: step 4 exact, then 1-5 % off). 0 = no
    step taken: FusedAdam adds 1 to a count it finds, as it starts one at 1."""
    made = 0
    for group in optimizer.param_groups:
        group.setdefault("step", 0)
        for p in group["params"]:
            if len(optimizer.state[p]) == 0:
                optimizer.initialize_state(p, store_param_remainders=False)  # FusedAdam's default, as in its step
                made += 1
    return made


def take_fp32_init_values(model) -> dict:
    """name -> the fp32 value each FP8 weight was quantized from (`quantized_model_init` kept it on the
    host), released from the weight: call before sharding (FSDP2's shards are new tensors)."""
    out = {}
    for name, p in model.named_parameters():
        value = getattr(p, "get_high_precision_init_val", lambda: None)()
        if value is not None:
            out[name] = value.float()
            p.clear_high_precision_init_val()
    return out


def seed_fp32_masters(optimizer, named_params, values: dict) -> int:
    """Set FusedAdam's fp32 master of each parameter in ``values`` (name -> the full fp32 tensor) to its
    local shard of that value, instead of the dequantized FP8 weight FusedAdam would start from (TE's
    examples/pytorch/quantized_model_init/fully_shard.py). Returns masters set."""
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    seeded = 0
    for name, p in named_params:
        full = values.get(name)
        if full is None:
            continue
        full = full.to(device=p.device, dtype=torch.float32)
        # each rank already holds the whole value: cut its own shard, no communication (src_data_rank=None)
        local = (distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
                 if isinstance(p, DTensor) else full)
        optimizer.initialize_state(p, store_param_remainders=False)
        optimizer.set_scaled_state(p, "master_param", local)
        seeded += 1
    return seeded


def gemm_weights(model) -> list[tuple[object, list[str], bool]]:
    """(module, its GEMM weight names, concatenated) for every TE GEMM module of ``model`` (Linear,
    LayerNormLinear: TE's ``weight_names``, concatenated into one GEMM weight every forward when there are
    several; LayerNormMLP: fc1 and fc2, two GEMMs): the modules whose wgrad GEMM can write an fp32
    ``main_grad`` itself (``fuse_wgrad_accumulation``, read by their forward)."""
    if not TE_AVAILABLE:
        return []
    out = []
    for m in model.modules():
        if isinstance(m, te.LayerNormMLP):
            out.append((m, ["fc1_weight", "fc2_weight"], False))
        elif isinstance(m, (te.Linear, te.LayerNormLinear)):
            out.append((m, list(m.weight_names), len(m.weight_names) > 1))
    return out


# TE's switch to cuDNN's normalization kernels (common/normalization/common.cpp in TE 2.20: forward and backward)
CUDNN_NORM_ENV = ("NVTE_NORM_FWD_USE_CUDNN", "NVTE_NORM_BWD_USE_CUDNN")
_norm_kernel: str | None = None  # the choice this process made (TE keeps its first reading)


def use_norm_kernel(kind: str) -> None:
    """Make ``kind`` ("te" or "cudnn") the RMSNorm kernels of this process. TE reads its two switches once, at
    its first normalization (a function-local static in common.cpp), while its PyTorch extension re-reads the
    forward one on every call to pick the FP8 path (csrc/extensions/normalization.cpp): a process that changed
    them after its first norm would mix the two and fail in the current-scaling recipe. So the first model
    built decides, and a later one (or a switch set in the environment) asking otherwise is refused."""
    global _norm_kernel  # noqa: PLW0603 - the process's one choice
    on = [k for k in CUDNN_NORM_ENV if os.environ.get(k) == "1"]
    current = _norm_kernel or ("cudnn" if on else None)  # None: free to choose
    if current not in (None, kind):
        why = "an earlier model of this process" if _norm_kernel else \
            " and ".join(f"{k}=1" for k in on) + " in the environment"
        raise ConfigError("norm_kernel", f"{current}: TE takes one normalization backend per process ({why})", kind)
    if kind == "cudnn":
        os.environ.update(dict.fromkeys(CUDNN_NORM_ENV, "1"))
    _norm_kernel = kind
