"""BF16 model weights with fp32 master copies (``master_weights: fp32``; the llm.c /
DeepSpeed-bf16 scheme).

`attach(model)` (from `PrecisionPlan.prepare_model`) turns every parameter into BF16, so the forward
casts no weight per step, and keeps one fp32 master per parameter (tied weights: one). Then:

- **gradients in fp32**: a ``register_post_accumulate_grad_hook`` per parameter adds its BF16 gradient
  into the master's fp32 ``.grad`` and frees the BF16 one, so accumulation over micro-steps is an
  fp32 sum of the micro-batch gradients;
- **the optimizer steps the masters**: `build_optimizer` sees the attached masters and builds
  `MasterWeightAdamW` (a real ``torch.optim.AdamW`` over the masters, so accelerate's
  ``AcceleratedOptimizer``, its state dict and the LR schedule work unchanged) which copies the
  masters back into the BF16 parameters after each step;
- **clipping acts on the masters**: `grad_params(model, optimizer)` is what `train_step` clips;
- **checkpoints stay fp32**: ``model.state_dict()`` returns the masters (a state-dict post-hook on
  each module that owns parameters, run before any other hook of that module, e.g. the fused-QKV
  split) and ``load_state_dict`` copies the saved values into the masters (a load pre-hook, run after
  the module's own, e.g. the QKV fuse) before the module rounds them into its BF16 parameters. So
  save, resume, export and the batch probe's restore all see fp32 masters, and resume is exact.

``fuse_wgrad_accumulation`` (TE backend, `fuse_wgrad`): the wgrad GEMM of every TE weight writes its master's
fp32 gradient itself, so those weights skip the BF16 gradient and the hook's cast.

One process only: DDP all-reduces the BF16 gradients the hook frees, DeepSpeed has its own
``bf16`` mode with fp32 masters (use that), and FSDP2's mixed precision is this scheme, sharded.
"""

from __future__ import annotations

import contextlib
import os

import torch

from .. import _te
from ..errors import ConfigError
from ..lint.fsdp import train_conflicts

ATTR = "_yx_masters"  # model attribute: {id(param): master}
FUSED = "_yx_main_grads"  # model attribute: the masters whose persistent .grad TE's wgrad GEMMs write (fuse_wgrad)
_paused = False  # `paused()`: the gradient hooks leave .grad alone (CUDA-graph warm-up runs its own backward)


@contextlib.contextmanager
def paused():
    """The post-accumulate hooks do nothing inside: TE's ``make_graphed_callables`` warm-up runs
    backward passes on sample data and reads the parameters' ``.grad`` back (newer TE)."""
    global _paused
    before, _paused = _paused, True
    try:
        yield
    finally:
        _paused = before


def attach(model: torch.nn.Module) -> int:
    """Make ``model``'s parameters BF16 with fp32 masters (idempotent); returns parameters converted."""
    if getattr(model, ATTR, None) is not None:
        return 0
    fsdp = os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true"  # fully_shard would replace the parameters
    for key, expected in train_conflicts(fsdp, {"master_weights": "fp32"}):  # the launch check's own rule
        raise ConfigError(key, expected, "fp32")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        raise ConfigError("master_weights", "none under DDP/DeepSpeed (one process only; DeepSpeed: its bf16 "
                                            "mode keeps fp32 masters)", "fp32")
    masters: dict[int, torch.Tensor] = {}
    params = [p for p in model.parameters() if p.is_floating_point()]  # deduplicated: a tied weight, one master
    for p in params:
        master = torch.nn.Parameter(p.detach().float().clone(), requires_grad=p.requires_grad)
        masters[id(p)] = master
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(_accumulate_into(master))
    _to_bf16_keeping_views(params)
    object.__setattr__(model, ATTR, masters)  # not a submodule / parameter: invisible to state_dict and .to()
    for module in model.modules():
        own = {n: masters[id(p)] for n, p in module._parameters.items() if p is not None and id(p) in masters}
        if own:
            handle = module.register_state_dict_post_hook(_save_masters(own))
            module._state_dict_hooks.move_to_end(handle.id, last=False)  # before e.g. the fused-QKV split
            module.register_load_state_dict_pre_hook(_load_masters(own))
    return len(masters)


def fuse_wgrad(model: torch.nn.Module) -> int:
    """``fuse_wgrad_accumulation`` on an attached model: each TE GEMM weight's ``main_grad`` IS its master's
    persistent fp32 ``.grad``, and its module's wgrad GEMM writes it (TE ``fuse_wgrad_accumulation``: fp32 output,
    accumulated over micro-steps in the GEMM, Megatron's scheme). TE then returns no gradient for the weight, so
    the BF16 gradient, the hook's fp32 cast and, under CUDA graphs, TE's clone of each graphed gradient are gone
    (the cast was the largest non-GEMM cost of the graphed medium step, docs/benchmarks.md). The gradients stay
    allocated: `MasterWeightAdamW.zero_grad` and `clear_grads` zero them in place. Returns the weights fused."""
    masters = getattr(model, ATTR, None)
    if masters is None:
        raise ConfigError("fuse_wgrad_accumulation", "false without master_weights fp32 (the wgrad GEMMs write the "
                                                     "fp32 masters' gradients)", True)
    if getattr(model, FUSED, None) is not None:
        return 0
    modules = _te.gemm_weights(model)
    if not modules:
        raise ConfigError("fuse_wgrad_accumulation", "false with backend torch (TE's wgrad GEMMs write the fp32 "
                                                     "gradients: backend te)", True)
    fused = []
    for module, names, concatenated in modules:
        if concatenated:  # TE concatenates split q/k/v per forward, and the concatenation has no main_grad
            raise ConfigError("fuse_wgrad_accumulation", "false without fuse_qkv_params or fuse_qkv_rope (TE's "
                                                         "split q/k/v weights are concatenated every forward)", True)
        for name in names:
            p = getattr(module, name)
            if p.requires_grad:
                master = masters[id(p)]
                master.grad = torch.zeros_like(master)  # on the weight's device: TE modules are built on the GPU
                p.main_grad = master.grad
                fused.append(master)
        module.fuse_wgrad_accumulation = True  # read by every forward (TE 2.20 Linear/LayerNormLinear/LayerNormMLP)
    object.__setattr__(model, FUSED, fused)
    return len(fused)


def clear_grads(model) -> None:
    """The masters without gradients (after CUDA-graph capture, whose warm-up backward ran on sample data):
    those that TE's wgrad GEMMs write are zeroed in place, TE holds their address."""
    fused = {id(m) for m in _unwrapped_attr(model, FUSED) or ()}
    for m in (masters_of(model) or {}).values():
        if id(m) in fused:
            m.grad.zero_()
        else:
            m.grad = None


def _to_bf16_keeping_views(params: list) -> None:
    """Each parameter becomes BF16; parameters that are views of one buffer (TE's q/k/v of
    ``LayerNormLinear(parameters_split=...)``, which TE then uses without a concatenation) become views
    of one BF16 buffer at the same offsets."""
    groups: dict[tuple, list] = {}
    for p in params:
        ptr = p.untyped_storage().data_ptr()
        groups.setdefault((p.device, ptr) if ptr and p.device.type != "meta" else (id(p),), []).append(p)
    for ps in groups.values():
        if len(ps) == 1 and ps[0].is_contiguous() and ps[0].storage_offset() == 0:
            ps[0].data = ps[0].data.to(torch.bfloat16)
            continue
        flat = torch.empty(0, dtype=ps[0].dtype, device=ps[0].device).set_(ps[0].untyped_storage())
        buf = flat.to(torch.bfloat16)
        for p in ps:
            p.data = buf.as_strided(p.size(), p.stride(), p.storage_offset())


def _accumulate_into(master: torch.Tensor):
    def hook(p: torch.Tensor) -> None:
        g = p.grad
        if _paused or g is None:  # None: TE's wgrad GEMM wrote master.grad (`fuse_wgrad`); autograd calls us anyway
            return
        if master.device != g.device:  # accelerate moved the model after attach(): follow it once
            master.data = master.data.to(g.device)
        if master.grad is None:
            master.grad = g.float()
        else:
            master.grad.add_(g)  # fp32 += bf16, in fp32
        p.grad = None
    return hook


def _save_masters(own: dict[str, torch.Tensor]):
    def hook(module, state_dict, prefix, local_metadata) -> None:
        for name, master in own.items():
            if prefix + name in state_dict:
                state_dict[prefix + name] = master.detach()
    return hook


def _load_masters(own: dict[str, torch.Tensor]):
    def hook(module, state_dict, prefix, *args) -> None:
        for name, master in own.items():
            value = state_dict.get(prefix + name)
            if torch.is_tensor(value) and value.shape == master.shape:
                with torch.no_grad():
                    master.copy_(value)
    return hook


def masters_of(model) -> dict[int, torch.Tensor] | None:
    """{id(param): fp32 master} of an attached model (under DDP/compile wrappers), else None."""
    return _unwrapped_attr(model, ATTR)


def _unwrapped_attr(model, attr: str):
    seen = set()
    while model is not None and id(model) not in seen:
        seen.add(id(model))
        if getattr(model, attr, None) is not None:
            return getattr(model, attr)
        model = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
    return None


class MasterWeightAdamW(torch.optim.AdamW):
    """AdamW over the fp32 masters; every step ends by rounding them into the model's BF16 params."""

    def __init__(self, pairs: list[tuple[torch.Tensor, torch.Tensor]], groups: list[dict], main_grads=(), **kwargs):
        self.pairs = pairs  # (bf16 model param, fp32 master)
        self.main_grads = list(main_grads)  # masters whose .grad TE's wgrad GEMMs write (`fuse_wgrad`): kept, zeroed
        self._on_device = False
        super().__init__(groups, **kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        keep = [m.grad for m in self.main_grads]
        super().zero_grad(set_to_none)
        for m, g in zip(self.main_grads, keep):
            m.grad = g
        if keep:
            torch._foreach_zero_(keep)

    def _follow_params(self) -> None:
        """Masters onto their params' device (accelerate moves the model after `attach`)."""
        for p, m in self.pairs:
            if m.device != p.device:
                m.data = m.data.to(p.device)
        self._on_device = True

    def load_state_dict(self, state_dict) -> None:
        """Masters first, so that torch puts the loaded AdamW state on their (the model's) device: a resume
        loads before any backward has moved them."""
        self._follow_params()
        super().load_state_dict(state_dict)

    @torch.no_grad()
    def clip_in_step(self, max_norm: float) -> torch.Tensor | None:
        """The masters' gradient norm, the clip to ``max_norm`` left to the next `step`: torch's fused AdamW
        divides each gradient by ``grad_scale`` in its kernel (the path GradScaler unscales through), so the clip
        costs no pass of its own over the fp32 gradients (a read and a write of 8 bytes a parameter: ~0.7 ms of
        the medium step on an H200). ``grad_scale`` is 1 / `clip_grad_norm_`'s clamped coefficient. None: not
        fused (the caller clips)."""
        if not self.defaults.get("fused"):
            return None
        norm = torch.nn.utils.get_total_norm([m.grad for _, m in self.pairs if m.grad is not None])
        if max_norm != float("inf"):
            self.grad_scale = torch.clamp((norm + 1e-6) / max_norm, min=1.0)
        return norm

    @torch.no_grad()
    def step(self, closure=None):
        if not self._on_device:  # masters of params that got no gradient yet still sit where attach() left them
            self._follow_params()
        try:
            loss = super().step(closure)
        finally:
            self.grad_scale = None  # one step's clip
        params, masters = [p for p, _ in self.pairs], [m for _, m in self.pairs]
        if hasattr(torch, "_foreach_copy_"):
            torch._foreach_copy_(params, masters)
        else:  # pragma: no cover - old torch
            for p, m in self.pairs:
                p.copy_(m)
        return loss


def build(model, groups: list[dict], fp8_weights: bool = False, **kwargs) -> torch.optim.Optimizer | None:
    """`build_optimizer`'s optimizer of fp32 masters: TE's FusedAdam for FP8 weights (``fp8_weight_all_gather``:
    an FP8 weight cannot take an Adam update itself), else AdamW over the masters of an attached model;
    None: neither."""
    if fp8_weights:
        kwargs.pop("fused", None)  # torch's AdamW switch; FusedAdam is fused
        return _te.fused_adam_with_masters(groups, **kwargs)
    masters = masters_of(model)
    if masters is None:
        return None
    pairs = [(p, masters[id(p)]) for g in groups for p in g["params"]]
    for p, m in pairs:  # onto the params' device (the trainer moves the model first): AdamW's fused kernel then applies
        if m.device != p.device:
            m.data = m.data.to(p.device)
    master_groups = [{**g, "params": [masters[id(p)] for p in g["params"]]} for g in groups]
    if "fused" in kwargs:
        kwargs["fused"] = kwargs["fused"] and all(m.is_cuda for _, m in pairs)
    return MasterWeightAdamW(pairs, master_groups, main_grads=_unwrapped_attr(model, FUSED) or (), **kwargs)


@contextlib.contextmanager
def model_params_in_groups(optimizer):
    """Inside, a `MasterWeightAdamW`'s groups hold the model's BF16 parameters instead of their fp32 masters.
    accelerate's FP8 ``prepare`` (``Accelerator._prepare_te``) converts the model's layers to TE and then maps
    every optimizer parameter to the model parameter of the same name: a master is none (KeyError, seen on an
    H200 with ``--use_fp8 --master_weights fp32``). A TE-backend model has nothing to convert, so each parameter
    maps to itself and the masters go back; a parameter the conversion replaced has no master: refused."""
    if not isinstance(optimizer, MasterWeightAdamW):
        yield
        return
    master_of = {id(p): m for p, m in optimizer.pairs}
    param_of = {id(m): p for p, m in optimizer.pairs}
    masters = [g["params"] for g in optimizer.param_groups]
    for g in optimizer.param_groups:
        g["params"] = [param_of[id(m)] for m in g["params"]]
    try:
        yield
    finally:
        replaced = any(id(p) not in master_of for g in optimizer.param_groups for p in g["params"])
        for g, ms in zip(optimizer.param_groups, masters):
            g["params"] = ms
    if replaced:
        raise ConfigError("master_weights", "none when accelerate converts the model's layers for FP8 (backend te "
                                            "builds TE layers: nothing to convert)", "fp32")


def clip_in_step(optimizer, max_norm: float) -> torch.Tensor | None:
    """`MasterWeightAdamW.clip_in_step` of a (wrapped) master-weight optimizer; None for any other."""
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer
    return inner.clip_in_step(max_norm) if isinstance(inner, MasterWeightAdamW) else None


def grad_params(model, optimizer) -> list[torch.Tensor]:
    """The tensors whose gradients `train_step` clips: the masters under master weights (the BF16
    params hold no gradient), else the model's parameters."""
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer
    if isinstance(inner, MasterWeightAdamW):
        return [m for _, m in inner.pairs]
    return list(model.parameters())
