"""Deciding precision before the Accelerator exists, and making the decision true at run time.

Design (docs/fp8.md has the source references). FP8 goes through accelerate as specified:
`accelerator_kwargs()` is ``Accelerator(mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs(...)])``,
so accelerate sets up BF16 autocast, DDP/DeepSpeed (`bf16.enabled`) and its TE bookkeeping. accelerate
1.15 alone is not trustworthy, though: its recipe can only be DelayedScaling/MXFP8, drops
`most_recent` and `interval`, disables FP8 in eval, raises for MXFP8 with `amax_compute_algo`, and
under DeepSpeed ignores `TERecipeKwargs`; `convert_model` would swap a plain `nn.Linear` LM head for
an untied `te.Linear`. So yxanul (1) keeps every plain linear out of `convert_model`'s reach (the LM
head is an `LMHead`, the TE model has no plain Linear/LayerNorm), (2) `after_prepare` removes
accelerate's `contextual_fp8_autocast` forward wrapper (it would be the innermost context and win)
and checks that `prepare()` replaced no module and kept the LM head tied, and (3) the trainer enters
`forward_context(training)` = `te.autocast(enabled=True, recipe=<built here from every configured
value>)` around each forward: the only FP8 context left, so the configured recipe is the one TE
uses, under single GPU, DDP and DeepSpeed alike.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from types import MethodType

import torch

from .. import _te
from ..errors import ConfigError, UserError
from .args import PrecisionArgs
from .forward import forward
from .master_weights import attach, fuse_wgrad
from .policy import KINDS, fp8_alignment, fp8_attention_unsupported, layer_policy, module_decisions
from .report import install_readback
from .state import FILE, fp8_state_dict, load_fp8_state_dict, no_pickled_extra_state
from .stats import fp8_stats

FORMATS = {"hybrid": "HYBRID", "e4m3": "E4M3", "e5m2": "E5M2"}
RECIPE_CLASSES = {"delayed": "DelayedScaling", "current": "Float8CurrentScaling",
                  "block": "Float8BlockScaling", "mxfp8": "MXFP8BlockScaling"}


@dataclass
class CapabilityFacts:
    """What the machine can do; probed for real (`probe_facts`), or injected by tests."""

    te_available: bool
    te_import_error: str | None
    cuda_available: bool
    device_name: str | None = None
    compute_capability: tuple[int, int] | None = None
    bf16_supported: bool = False
    recipes: dict[str, tuple[bool, str]] = field(default_factory=dict)  # recipe -> (available, TE's reason)
    te_version: str | None = None
    # oneDNN's BF16 GEMMs (AVX512/AMX); without them (AVX2 only) torch's BF16 matmuls take a reference path
    cpu_bf16_gemm: bool = True


def _cpu_bf16_gemm() -> bool:
    try:  # the check torch's own inductor makes (torch/_inductor/utils.py, is_mkldnn_bf16_supported)
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN: no way to tell, so no warning
        return True


def probe_facts() -> CapabilityFacts:
    cuda = torch.cuda.is_available()
    return CapabilityFacts(
        te_available=_te.TE_AVAILABLE, te_import_error=_te.TE_IMPORT_ERROR, cuda_available=cuda,
        device_name=torch.cuda.get_device_name() if cuda else None,
        compute_capability=tuple(torch.cuda.get_device_capability()) if cuda else None,
        bf16_supported=bool(cuda and torch.cuda.is_bf16_supported()),
        recipes=_te.availability() if cuda else {},
        te_version=_te.te_version or _te.te_installed_version, cpu_bf16_gemm=cuda or _cpu_bf16_gemm())


def recipe_spec(args: PrecisionArgs) -> tuple[str, dict]:
    """(TE recipe class name, kwargs): every configured value TE has a field for (TE 2.20
    `common/recipe/__init__.py`). Pure Python, so it is testable without TE. `fp8_interval` has no
    TE field (removed in TE 1.8; amax/scale update after every step) and is only recorded."""
    fmt = FORMATS[args.fp8_format]
    attention = {"fp8_dpa": True} if args.fp8_attention else {}  # delayed/current only (PrecisionArgs checks)
    if args.fp8_recipe == "delayed":
        return "DelayedScaling", {"margin": args.fp8_margin, "fp8_format": fmt,
                                  "amax_history_len": args.fp8_amax_history_len,
                                  "amax_compute_algo": args.fp8_amax_compute_algo, **attention}
    if args.fp8_recipe == "mxfp8":
        return "MXFP8BlockScaling", {"margin": args.fp8_margin, "fp8_format": fmt}
    return RECIPE_CLASSES[args.fp8_recipe], {"fp8_format": fmt, **attention}


def build_recipe(args: PrecisionArgs):
    """The TE recipe object (TE recipes are pydantic dataclasses: `fp8_format` must be a `Format`)."""
    name, kwargs = recipe_spec(args)
    kwargs = dict(kwargs, fp8_format=getattr(_te.te_recipe.Format, kwargs["fp8_format"]))
    return getattr(_te.te_recipe, name)(**kwargs)


def te_recipe_kwargs(args: PrecisionArgs) -> dict:
    """accelerate's `TERecipeKwargs` closest to the configured recipe. accelerate can express only
    DelayedScaling and MXFP8, and its wrapper is removed after `prepare` anyway; these kwargs only
    have to be valid: no `interval` (TE's recipes have no such field) and, for MXFP8, none of the
    amax fields (`apply_fp8_autowrap` raises on them)."""
    kw = {"fp8_format": FORMATS[args.fp8_format], "margin": args.fp8_margin,
          "use_autocast_during_eval": args.fp8_eval}
    if args.fp8_recipe == "mxfp8":
        return {**kw, "use_mxfp8_block_scaling": True}
    return {**kw, "amax_history_len": args.fp8_amax_history_len, "amax_compute_algo": args.fp8_amax_compute_algo}


def decide(args: PrecisionArgs, config, facts: CapabilityFacts) -> tuple[bool, str | None]:
    """(FP8 possible, reason when not). Pure: testable with injected facts."""
    if not args.use_fp8:
        return False, None
    if not facts.cuda_available:
        return False, "no CUDA device"
    if not facts.te_available:
        return False, f"Transformer Engine is not importable ({facts.te_import_error})"
    cc = tuple(facts.compute_capability or (0, 0))
    if cc < (8, 9):
        return False, (f"compute capability {cc[0]}.{cc[1]} < 8.9 ({facts.device_name}): "
                       "FP8 needs Ada, Hopper or Blackwell")
    ok, reason = facts.recipes.get(args.fp8_recipe, (False, "TE reported nothing for this recipe"))
    if not ok:
        return False, f"recipe '{args.fp8_recipe}' not available: {reason or 'TE says no'}"
    backend = getattr(config, "backend", "torch")
    if backend != "te":
        return False, f"model backend is '{backend}' (FP8 needs backend te)"
    policy = layer_policy(config, args)
    if not any(policy[k][0] for k in KINDS):
        return False, "no layer passes the small-GEMM policy (" + "; ".join(f"{k}: {policy[k][1]}" for k in KINDS) + ")"
    return True, None


def resolve_precision(args: PrecisionArgs, config, facts: CapabilityFacts | None = None,
                      say=print) -> PrecisionPlan:
    """Decide FP8 / BF16 / FP32 before the Accelerator exists. An impossible FP8 prints ONE line
    (or raises a one-line UserError with ``require_fp8``)."""
    facts = facts or probe_facts()
    fp8, reason = decide(args, config, facts)
    if args.mixed_precision == "auto":
        base = "bf16" if (facts.bf16_supported or fp8) else "fp32"
    else:
        base = args.mixed_precision
    if args.master_weights == "fp32" and base != "bf16":
        raise ConfigError("master_weights", f"none here: mixed_precision resolved to {base} (no BF16 on this "
                                            "device); fp32 needs mixed_precision bf16", args.master_weights)
    policy = layer_policy(config, args)
    if args.fp8_weight_all_gather:
        _check_all_layers_fp8(args, fp8, reason, policy)
    if fp8:
        check_fp8_attention(args, facts, config)
    if args.use_fp8 and not fp8:
        if args.require_fp8:
            raise UserError(f"require_fp8: FP8 is impossible here: {reason}")
        say(f"FP8 off: {reason}; training in {base.upper()}")
    if base == "bf16" and not facts.cuda_available and not facts.cpu_bf16_gemm:
        say("warning: BF16 on this CPU is slow: it has no oneDNN BF16 kernels (AVX2 only), so BF16 matmuls take "
            "torch's reference path (a nano step ~40x FP32's on a 2-core AMD EPYC); --mixed_precision fp32 trains "
            "faster here")
    if args.use_fp8 and args.fp8_interval != 1:
        say(f"warning: fp8_interval={args.fp8_interval} has no effect (TE has no 'interval' since 1.8: "
            "scales update after every step); recorded only")
    return PrecisionPlan(args, fp8, reason, base, policy, facts)


def check_fp8_attention(args: PrecisionArgs, facts: CapabilityFacts, config) -> None:
    """``fp8_attention`` where TE cannot train it: one line before anything runs (`fp8_attention_unsupported`)."""
    why = fp8_attention_unsupported(args.fp8_recipe, config.head_dim, facts.compute_capability, facts.device_name,
                                    facts.te_version) if args.fp8_attention else None
    if why:
        raise ConfigError("fp8_attention", f"false {why}", True)


def _check_all_layers_fp8(args: PrecisionArgs, fp8: bool, reason: str | None, policy: dict) -> None:
    """fp8_weight_all_gather builds every TE GEMM weight in FP8: FP8 must be on, and no layer kept BF16
    (it would compute in BF16 from FP8-rounded weights)."""
    if not fp8:
        raise ConfigError("fp8_weight_all_gather", f"false here: FP8 is off ({reason})", True)
    kept = [f"{k} ({policy[k][1]})" for k in KINDS if not policy[k][0]]
    if kept or args.fp8_keep_bf16:
        why = "; ".join(kept) if kept else f"fp8_keep_bf16 {args.fp8_keep_bf16}"
        raise ConfigError("fp8_weight_all_gather", f"every TE layer in FP8, but the policy keeps some BF16: {why} "
                                                   "(set fp8_min_gemm_dim 0, drop fp8_keep_bf16)", True)


class PrecisionPlan:
    """The decision and what makes it true. Trainer protocol: `accelerator_kwargs()` ->
    `prepare_model(model)` -> `accelerator.prepare` -> `after_prepare(model)` -> forwards under
    `forward_context(training)` with `is_first_microbatch(i)`; `label` for console lines."""

    def __init__(self, args, fp8_enabled, fallback_reason, base, policy, facts):
        self.args, self.fp8_enabled, self.fallback_reason = args, fp8_enabled, fallback_reason
        self.base, self.policy, self.facts = base, policy, facts
        self.recipe_name, self.recipe_kwargs = recipe_spec(args)
        self.recipe = build_recipe(args) if fp8_enabled else None
        self.decisions: dict[str, tuple[str, bool, str]] = {}  # module -> (kind, FP8, why), by prepare_model
        self.readback: dict | None = None  # TE's own state, recorded during the first training forward
        self._snapshot: dict[str, str] | None = None
        self._tied = False
        # False when the weights are sharded (ZeRO-3, FSDP2): TE's FP8 weight cache would keep an
        # unsharded FP8 copy of every layer on every GPU between micro-batches
        self.cache_fp8_weights = True
        self.sharding: dict | None = None  # FSDP2: mesh and gather/reduce dtypes (training/fsdp.py)

    @property
    def label(self) -> str:
        if not self.fp8_enabled:
            return {"bf16": "BF16", "fp32": "FP32"}[self.base]
        if self.readback is None:
            return "FP8?"  # not yet confirmed by TE
        return "FP8" if self.readback.get("fp8_confirmed") else self.base.upper()

    @property
    def token_alignment(self) -> int:
        """Tokens per micro-batch must be a multiple of this (1 without FP8)."""
        return fp8_alignment(self.args.fp8_recipe) if self.fp8_enabled else 1

    def accelerator_kwargs(self) -> dict:
        """For `accelerate.Accelerator(...)`: ``mixed_precision="fp8"`` with `TERecipeKwargs` for an
        FP8 plan (accelerate's wrapper is removed again by `after_prepare`), else bf16 / no."""
        if not self.fp8_enabled:
            return {"mixed_precision": "no" if self.base == "fp32" else "bf16"}
        from accelerate.utils import TERecipeKwargs

        return {"mixed_precision": "fp8", "kwargs_handlers": [TERecipeKwargs(**te_recipe_kwargs(self.args))]}

    # -- model hooks --------------------------------------------------------------------------
    def prepare_model(self, model, say=print) -> None:
        """Before `accelerator.prepare`: no pickled TE extra state, the small-GEMM policy (layers
        kept BF16 run inside `te.autocast(enabled=False)`), TE read-back hooks, and a snapshot of
        the module tree for `after_prepare`."""
        self._snapshot = _module_classes(_inner(model))
        if self.args.master_weights == "fp32":  # BF16 params, fp32 masters (build_optimizer steps those)
            attach(model)
            if self.args.fuse_wgrad_accumulation:  # TE's wgrad GEMMs write the masters' fp32 gradients
                fuse_wgrad(model)
        head, emb = getattr(model, "lm_head", None), getattr(getattr(model, "model", None), "embed_tokens", None)
        self._tied = head is not None and emb is not None and head.weight is emb.weight
        if getattr(model.config, "backend", "torch") == "te":
            no_pickled_extra_state(model)
        decisions = module_decisions(model, self.policy, self.args.fp8_keep_bf16)
        if not self.fp8_enabled:
            why = self.fallback_reason or "FP8 not requested"
            self.decisions = {n: (k, False, why) for n, (k, _, _) in decisions.items()}
            return
        self.decisions = decisions
        if not any(fp8 for _, fp8, _ in decisions.values()):
            reason = "no TE module left in FP8 after the policy and fp8_keep_bf16"
            if self.args.require_fp8:
                raise UserError(f"require_fp8: {reason}")
            say(f"FP8 off: {reason}; training in {self.base.upper()}")
            self.fp8_enabled, self.fallback_reason, self.recipe = False, reason, None
            return

        modules = dict(model.named_modules())
        for name, (_, fp8, _) in decisions.items():
            if not fp8:
                _run_without_fp8(modules[name], _te, self.recipe)
        install_readback(self, model)

    def after_prepare(self, model) -> None:
        """After `accelerator.prepare`: remove any accelerate FP8 forward wrapper and check that
        prepare() replaced no module (convert_model) and kept the LM head tied."""
        unwrap_accelerate_fp8(model)
        if self._snapshot is None:
            return
        inner = _inner(model)
        now = _module_classes(inner)
        changed = [f"{n}: {t} -> {now.get(n)}" for n, t in self._snapshot.items() if now.get(n) != t]
        if changed:
            raise RuntimeError("accelerate.prepare() replaced modules (its FP8 convert_model?): "
                               + "; ".join(changed[:5]))
        if self._tied and inner.lm_head.weight is not inner.model.embed_tokens.weight:
            raise RuntimeError("accelerate.prepare() untied lm_head from embed_tokens")

    def forward_context(self, training: bool):
        """FP8 around a forward (and its backward): training always, eval only with fp8_eval."""
        if not self.fp8_enabled or not (training or self.args.fp8_eval):
            return contextlib.nullcontext()

        return _te.autocast(enabled=True, recipe=self.recipe)

    @property
    def fp8_weights(self) -> bool:
        """The TE GEMM weights themselves are FP8 (``fp8_weight_all_gather``): built by `weight_init`,
        stepped by TE's FusedAdam through fp32 masters."""
        return self.fp8_enabled and self.args.fp8_weight_all_gather

    def weight_init(self):
        """Around building the model: TE's ``quantized_model_init`` with this recipe when `fp8_weights`."""
        return _te.quantized_model_init(self.recipe) if self.fp8_weights else contextlib.nullcontext()

    def is_first_microbatch(self, micro_step_in_accum: int) -> bool | None:
        """TE quantizes and caches FP8 weights on True, reuses them on False, re-quantizes on None."""
        return (micro_step_in_accum == 0) if self.fp8_enabled and self.cache_fp8_weights else None

    # -- checkpoints, stats, metadata ---------------------------------------------------------
    def save_fp8_state(self, model, directory) -> None:
        """Write the delayed-scaling state next to accelerate's files (main process)."""
        from pathlib import Path

        from safetensors.torch import save_file

        sd = fp8_state_dict(model) if self.fp8_enabled else {}
        if sd:
            save_file(sd, str(Path(directory) / FILE))

    def restore_fp8_state(self, model, directory, seq_length: int) -> int:
        """After `load_state`: one no-grad FP8 forward makes TE allocate its FP8 metadata for this
        recipe (no amax reduction happens without grad: `autocast_exit`), then the saved tensors are
        copied in, so the resumed step uses the saved scales. Returns tensors restored."""
        from pathlib import Path

        from safetensors.torch import load_file

        path = Path(directory) / FILE
        if not (self.fp8_enabled and path.is_file()):
            return 0
        device = next(model.parameters()).device
        n = max(16, min(seq_length, 64) // 16 * 16)
        x = torch.zeros(1, n, dtype=torch.long, device=device)  # (1, n)
        with torch.no_grad():
            forward(model, x, x, plan=self, micro=None, training=True)
        return load_fp8_state_dict(model, load_file(str(path)))

    def fp8_stats(self, model) -> dict[str, float]:
        return fp8_stats(model) if self.fp8_enabled else {}

    def metadata(self) -> dict:
        """For checkpoint metadata / trainer_state.json (keys do not collide with 'precision')."""
        return {"fp8": self.fp8_enabled, "mixed_precision": self.base,
                "fp8_recipe": self.recipe_name if self.fp8_enabled else None,
                "fp8_recipe_kwargs": self.recipe_kwargs if self.fp8_enabled else None,
                "fp8_fallback_reason": self.fallback_reason}


def _run_without_fp8(module, _te, recipe) -> None:
    """The module's forward runs inside `te.autocast(enabled=False)`: innermost context wins, so it
    computes in BF16 inside the FP8 region; its backward follows what the forward saved (ctx.fp8)."""
    if getattr(module, "_yx_fp8", None) is False:
        return
    orig = module.forward

    def forward(self, *args, **kwargs):
        with _te.autocast(enabled=False, recipe=recipe):
            return orig(*args, **kwargs)

    module.forward = MethodType(forward, module)
    module._yx_fp8 = False


def _module_classes(model) -> dict[str, str]:
    """name -> class name of each module, seen through what FSDP2 and PEFT legitimately change: ``fully_shard``
    swaps a module's class for a subclass ``FSDP<Name>``, activation checkpointing puts the layer under
    ``<name>._checkpoint_wrapped_module`` of a ``CheckpointWrapper``, a PEFT adapter (LoRA's) puts it under
    ``<name>.base_layer`` of the adapter module (the adapter's own modules are no module of the model's)."""
    from torch.distributed.fsdp import FSDPModule

    out: dict[str, str] = {}

    def visit(m, name: str) -> None:
        cls = type(m).__name__
        if cls == "CheckpointWrapper":
            return visit(m._checkpoint_wrapped_module, name)
        if type(m).__module__.startswith("peft.") and isinstance(getattr(m, "base_layer", None), torch.nn.Module):
            return visit(m.base_layer, name)
        if isinstance(m, FSDPModule) and cls.startswith("FSDP"):
            cls = cls[len("FSDP"):]
        out[name] = cls
        for child, sub in m.named_children():
            visit(sub, f"{name}.{child}" if name else child)

    visit(model, "")
    return out


def _inner(model):
    """The user model under DDP / DeepSpeedEngine / torch.compile / PEFT (``PeftModel``, e.g. TRL's peft_config)."""
    while True:
        if type(model).__module__.startswith("peft.") and hasattr(model, "get_base_model"):
            model = model.get_base_model()
            continue
        nxt = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if not isinstance(nxt, torch.nn.Module):
            return model
        model = nxt


def unwrap_accelerate_fp8(model) -> int:
    """Undo accelerate's `apply_fp8_autowrap` (utils/transformer_engine.py): it sets
    ``model.forward = MethodType(contextual_fp8_autocast(...).forward, model)`` with
    ``forward.__wrapped__ = <previous forward>``, on the model (single process, DeepSpeed) or on the
    DDP wrapper (MULTI_GPU: `delayed_fp8_autocast`). Returns wrappers removed."""
    removed, seen, todo = 0, set(), [model]
    while todo:
        m = todo.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        while True:
            fw = m.__dict__.get("forward")
            func = getattr(fw, "__func__", fw)
            if func is None or not getattr(func, "__qualname__", "").startswith("contextual_fp8_autocast"):
                break
            prev = func.__wrapped__
            if getattr(prev, "__self__", None) is m and getattr(prev, "__func__", None) is type(m).forward:
                del m.forward  # the class forward again
            else:
                m.forward = prev
            removed += 1
        for attr in ("module", "_orig_mod"):
            if isinstance(getattr(m, attr, None), torch.nn.Module):
                todo.append(getattr(m, attr))
    return removed
