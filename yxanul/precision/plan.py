"""Deciding precision before the Accelerator exists, and making the decision true at run time.

accelerate 1.15's FP8 path alone is not trustworthy (docs/fp8.md): its recipe can't express
current/block scaling, drops `interval` and `most_recent`, is ignored under DeepSpeed, disables FP8
in eval, and `convert_model` would turn a plain `nn.Linear` LM head into `te.Linear`. yxanul
therefore (1) still builds `Accelerator(mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs])`
so accelerate sets up BF16 autocast, DDP/DeepSpeed and its FP8 bookkeeping, (2) keeps every plain
linear out of `convert_model`'s reach (the LM head is not an `nn.Linear`), (3) removes accelerate's
forward wrapper after `prepare` and (4) enters `te.autocast(recipe=<yxanul's recipe>)` itself, so
the recipe in effect is exactly the configured one, under DDP and DeepSpeed alike.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from types import MethodType

import torch

from ..errors import UserError
from .args import PrecisionArgs

_FORMATS = {"hybrid": "HYBRID", "e4m3": "E4M3", "e5m2": "E5M2"}
_RECIPE_CLASSES = {"delayed": "DelayedScaling", "current": "Float8CurrentScaling",
                   "block": "Float8BlockScaling", "mxfp8": "MXFP8BlockScaling"}


@dataclass
class CapabilityFacts:
    """What the machine can do; probed for real, or injected by tests."""

    te_available: bool
    te_import_error: str | None
    cuda_available: bool
    device_name: str | None = None
    compute_capability: tuple[int, int] | None = None
    bf16_supported: bool = False
    recipes: dict[str, tuple[bool, str]] = field(default_factory=dict)  # recipe -> (available, reason)


def probe_facts() -> CapabilityFacts:
    from .. import _te

    cuda = torch.cuda.is_available()
    return CapabilityFacts(
        te_available=_te.TE_AVAILABLE, te_import_error=_te.TE_IMPORT_ERROR, cuda_available=cuda,
        device_name=torch.cuda.get_device_name() if cuda else None,
        compute_capability=torch.cuda.get_device_capability() if cuda else None,
        bf16_supported=cuda and torch.cuda.is_bf16_supported(),
        recipes=_te.availability() if cuda else {},
    )


def recipe_spec(args: PrecisionArgs) -> tuple[str, dict]:
    """(TE recipe class name, kwargs) carrying every configured value TE has a field for."""
    fmt = _FORMATS[args.fp8_format]
    if args.fp8_recipe == "delayed":
        return "DelayedScaling", {"margin": args.fp8_margin, "fp8_format": fmt,
                                  "amax_history_len": args.fp8_amax_history_len,
                                  "amax_compute_algo": args.fp8_amax_compute_algo}
    if args.fp8_recipe in ("current", "block"):
        return _RECIPE_CLASSES[args.fp8_recipe], {"fp8_format": fmt}
    return "MXFP8BlockScaling", {"fp8_format": fmt}


def build_recipe(args: PrecisionArgs):
    from .. import _te

    name, kwargs = recipe_spec(args)
    kwargs = dict(kwargs, fp8_format=getattr(_te.te_recipe.Format, kwargs["fp8_format"]))
    return getattr(_te.te_recipe, name)(**kwargs)


def te_recipe_kwargs(args: PrecisionArgs) -> dict:
    """accelerate's TERecipeKwargs closest to the recipe (accelerate can express only these)."""
    return {"fp8_format": _FORMATS[args.fp8_format], "margin": args.fp8_margin,
            "amax_history_len": args.fp8_amax_history_len, "amax_compute_algo": args.fp8_amax_compute_algo,
            "use_autocast_during_eval": args.fp8_eval, "use_mxfp8_block_scaling": args.fp8_recipe == "mxfp8"}


def gemm_shapes(config) -> dict[str, tuple[int, int]]:
    """Weight shapes (out, in) of the TE modules of one block, by kind."""
    h, f = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * config.head_dim
    return {"qkv": (h + 2 * kv, h), "proj": (h, h), "mlp": (2 * f, h)}  # mlp: fc1 (2f x h), fc2 (h x f)


def layer_policy(config, args: PrecisionArgs) -> dict[str, tuple[bool, str]]:
    """Small-GEMM policy per layer kind: (runs FP8, why). The LM head always stays BF16."""
    out = {}
    h, f = config.hidden_size, config.intermediate_size
    dims = {"qkv": gemm_shapes(config)["qkv"], "proj": (h, h), "mlp": (2 * f, h, f)}
    for kind, d in dims.items():
        if any(x % 16 for x in d):
            out[kind] = (False, f"a dimension of {d} is not a multiple of 16")
        elif min(d) < args.fp8_min_gemm_dim:
            out[kind] = (False, f"min GEMM dim {min(d)} < fp8_min_gemm_dim {args.fp8_min_gemm_dim}")
        else:
            out[kind] = (True, "large enough")
    out["lm_head"] = (False, "kept BF16 (output logits; tied embedding)")
    return out


def decide(args: PrecisionArgs, config, facts: CapabilityFacts) -> tuple[bool, str | None]:
    """(FP8 possible, reason when not). Pure: testable with injected facts."""
    if not args.use_fp8:
        return False, None
    if not facts.te_available:
        return False, f"Transformer Engine is not importable ({facts.te_import_error})"
    if not facts.cuda_available:
        return False, "no CUDA device"
    if facts.compute_capability is not None and tuple(facts.compute_capability) < (8, 9):
        cc = ".".join(map(str, facts.compute_capability))
        return False, f"compute capability {cc} < 8.9 ({facts.device_name}): FP8 needs Ada, Hopper or Blackwell"
    ok, reason = facts.recipes.get(args.fp8_recipe, (True, ""))
    if not ok:
        return False, f"recipe '{args.fp8_recipe}' not available: {reason or 'TE says no'}"
    if getattr(config, "backend", "torch") != "te":
        return False, f"model backend is '{config.backend}' (FP8 needs backend te)"
    policy = layer_policy(config, args)
    if not any(ok for k, (ok, _) in policy.items() if k != "lm_head"):
        return False, "every layer is below the small-GEMM policy (" + \
            "; ".join(f"{k}: {why}" for k, (ok, why) in policy.items() if k != "lm_head") + ")"
    return True, None


def resolve_precision(args: PrecisionArgs, config, facts: CapabilityFacts | None = None, say=print) -> "PrecisionPlan":
    facts = facts or probe_facts()
    fp8, reason = decide(args, config, facts)
    if args.use_fp8 and not fp8:
        if args.require_fp8:
            raise UserError(f"require_fp8: FP8 is impossible here: {reason}")
        say(f"FP8 off: {reason}; training in {'BF16' if facts.bf16_supported else 'FP32'}")
    if args.fp8_interval != 1:
        say(f"warning: fp8_interval={args.fp8_interval} has no effect (TE removed 'interval'; scales update every step)")
    if fp8:
        base = "bf16"
    elif args.mixed_precision == "auto":
        base = "bf16" if facts.bf16_supported else "fp32"
    else:
        base = args.mixed_precision
    return PrecisionPlan(args, fp8, reason, base, layer_policy(config, args) if fp8 else {}, facts)


class PrecisionPlan:
    def __init__(self, args, fp8_enabled, fallback_reason, base, policy, facts):
        self.args, self.fp8_enabled, self.fallback_reason = args, fp8_enabled, fallback_reason
        self.base, self.policy, self.facts = base, policy, facts
        self.recipe = build_recipe(args) if fp8_enabled else None
        self.readback: dict | None = None  # filled by a hook during the first FP8-layer forward

    @property
    def label(self) -> str:
        if self.fp8_enabled:
            # "FP8" only once TE itself confirmed it inside a forward; before that, say so
            if self.readback is not None and self.readback.get("fp8_enabled"):
                return "FP8"
            return "BF16" if self.readback is not None else "FP8?"
        return {"bf16": "BF16", "fp32": "FP32"}[self.base]

    def accelerator_kwargs(self) -> dict:
        if not self.fp8_enabled:
            return {"mixed_precision": "no" if self.base == "fp32" else "bf16"}
        from accelerate.utils import TERecipeKwargs

        return {"mixed_precision": "fp8", "kwargs_handlers": [TERecipeKwargs(**te_recipe_kwargs(self.args))]}

    def prepare_model(self, model) -> None:
        """Before accelerate.prepare: layers the policy keeps BF16 run with FP8 disabled; a hook on
        the first FP8 layer reads TE's own state back while a forward runs."""
        if getattr(model.config, "backend", "torch") == "te":
            from .state import strip_extra_state

            strip_extra_state(model)  # checkpoints carry FP8 state as safetensors, never pickle
        if not self.fp8_enabled:
            return
        from .. import _te

        first = None
        for layer in model.model.layers:
            for kind, module in (("qkv", layer.self_attention.layernorm_qkv), ("proj", layer.self_attention.proj),
                                 ("mlp", layer.layernorm_mlp)):
                if not self.policy[kind][0]:
                    _run_without_fp8(module, _te)
                elif first is None:
                    first = module

        def hook(module, inputs):
            if self.readback is None and module.training:
                enabled, recipe = _te.fp8_state()
                self.readback = {"fp8_enabled": enabled, "recipe": type(recipe).__name__ if recipe else None,
                                 "fp8_format": str(getattr(recipe, "fp8_format", None)),
                                 "recipe_repr": repr(recipe)}
                handle.remove()

        handle = first.register_forward_pre_hook(hook)

    def after_prepare(self, model) -> None:
        """Remove accelerate's ``contextual_fp8_autocast`` forward wrappers (its recipe would be the
        innermost one and win over ours); ``forward_context`` provides the configured recipe."""
        seen, todo = set(), [model]
        while todo:
            m = todo.pop()
            if id(m) in seen:
                continue
            seen.add(id(m))
            fw = m.__dict__.get("forward")
            func = getattr(fw, "__func__", fw)
            if func is not None and getattr(func, "__qualname__", "").startswith("contextual_fp8_autocast"):
                m.forward = func.__wrapped__
            for attr in ("module", "_orig_mod"):
                if isinstance(getattr(m, attr, None), torch.nn.Module):
                    todo.append(getattr(m, attr))

    def forward_context(self, training: bool):
        if not self.fp8_enabled or not (training or self.args.fp8_eval):
            return contextlib.nullcontext()
        from .. import _te

        return _te.autocast(enabled=True, recipe=self.recipe)

    def is_first_microbatch(self, micro_step: int):
        """TE caches FP8 weights on the first micro-batch of a step and reuses them after."""
        return (micro_step == 0) if self.fp8_enabled else None

    def save_fp8_state(self, model, directory) -> None:
        """Write the delayed-scaling state next to accelerate's files (main process)."""
        from pathlib import Path

        from safetensors.torch import save_file

        from .state import FILE, fp8_state_dict

        sd = fp8_state_dict(model) if self.fp8_enabled else {}
        if sd:
            save_file(sd, str(Path(directory) / FILE))

    def restore_fp8_state(self, model, directory, seq_length: int) -> int:
        """After load_state: initialise TE's FP8 metadata with one no-grad forward, then copy the
        saved scaling state in, so the resumed step uses exactly the saved scales."""
        from pathlib import Path

        from safetensors.torch import load_file

        from .state import FILE, load_fp8_state_dict

        path = Path(directory) / FILE
        if not (self.fp8_enabled and path.is_file()):
            return 0
        device = next(model.parameters()).device
        with torch.no_grad(), self.forward_context(training=True):
            model(torch.zeros(1, min(seq_length, 16), dtype=torch.long, device=device))
        return load_fp8_state_dict(model, load_file(str(path)))

    def fp8_stats(self, model) -> dict[str, float]:
        from .report import fp8_stats

        return fp8_stats(model)

    def metadata(self) -> dict:
        name, kwargs = recipe_spec(self.args)
        return {"fp8": self.fp8_enabled, "fp8_recipe": name if self.fp8_enabled else None,
                "fp8_recipe_kwargs": kwargs if self.fp8_enabled else None, "fp8_fallback_reason": self.fallback_reason}


def _run_without_fp8(module, _te) -> None:
    """Wrap ``module.forward`` in ``te.autocast(enabled=False)``: the layer runs BF16 inside FP8."""
    orig = module.forward

    def forward(self, *args, **kwargs):
        with _te.autocast(enabled=False):
            return orig(*args, **kwargs)

    module.forward = MethodType(forward, module)
    module._yx_fp8 = False
