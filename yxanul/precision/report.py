"""Precision report: what runs FP8, what BF16, and what TE itself says was in effect.

The read-back comes from TE, during the first training forward after `prepare_model`:
- a forward PRE-hook on the first module the policy keeps in FP8 reads TE's global state
  (`FP8GlobalStateManager.is_fp8_enabled()` / `.get_fp8_recipe()`, TE 2.20 `quantization.py`), i.e.
  the recipe object TE will quantize with, wherever the autocast came from;
- a forward POST-hook on every policy module reads what that module actually did: TE sets
  `module.fp8` in `init_fp8_metadata` (`module/base.py`) from the autocast state in effect inside
  its forward, and `module.fp8_meta["recipe"]` to the recipe it used.
The hooks remove themselves once every module has been seen. `precision_report` then counts FP8 and
non-FP8 modules per kind from TE's answers ("layers_source": "te"); before that, from the plan ("plan").
The non-FP8 count is keyed by the dtype that actually ran, the plan's base (``"base_dtype"``): per kind
``{"fp8": n, "bf16": m}`` in a BF16 run, ``{"fp8": 0, "fp32": m}`` in an FP32 run.
"""

from __future__ import annotations

from .. import _te
from ..errors import UserError
from .policy import KINDS, LM_HEAD_WHY, policy_modules


def install_readback(plan, model) -> None:
    seen: dict[str, tuple[str, bool, str | None]] = {}
    handles = []
    glob: dict = {}
    names = {m: n for n, _, m in policy_modules(model)}
    kinds = {n: k for n, k, _ in policy_modules(model)}
    first_fp8 = next((n for n, (_, fp8, _) in plan.decisions.items() if fp8), None)

    def pre(module, inputs):
        if module.training and not glob:
            enabled, recipe = _te.fp8_state()
            glob.update(fp8_enabled=enabled, recipe=type(recipe).__name__ if recipe is not None else None,
                        fp8_format=_fmt(recipe), recipe_repr=repr(recipe) if recipe is not None else None)

    def post(module, inputs, output):
        if not module.training:
            return
        name = names[module]
        recipe = module.fp8_meta.get("recipe") if getattr(module, "fp8", False) else None
        seen.setdefault(name, (kinds[name], bool(getattr(module, "fp8", False)),
                               type(recipe).__name__ if recipe is not None else None))
        if len(seen) == len(names):
            for h in handles:
                h.remove()
            _finish(plan, glob, seen)

    for module, name in names.items():
        if name == first_fp8:
            handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))


def _fmt(recipe) -> str | None:
    fmt = getattr(recipe, "fp8_format", None)
    return getattr(fmt, "name", None) if fmt is not None else None


def _finish(plan, glob: dict, seen: dict) -> None:
    layers = {k: {"fp8": 0, plan.base: 0} for k in KINDS}
    recipes = set()
    for kind, fp8, recipe in seen.values():
        layers[kind]["fp8" if fp8 else plan.base] += 1
        if recipe:
            recipes.add(recipe)
    n_fp8 = sum(v["fp8"] for v in layers.values())
    expected = sum(1 for _, fp8, _ in plan.decisions.values() if fp8)
    confirmed = bool(glob.get("fp8_enabled")) and n_fp8 > 0 and recipes <= {plan.recipe_name}
    plan.readback = {**glob, "module_recipes": sorted(recipes), "layers": layers, "fp8_modules": n_fp8,
                     "fp8_modules_planned": expected, "fp8_confirmed": confirmed}
    if plan.args.require_fp8 and (not confirmed or n_fp8 != expected):
        raise UserError(f"require_fp8: TE ran {n_fp8}/{expected} planned FP8 modules in FP8 "
                        f"(global fp8={glob.get('fp8_enabled')}, recipes {sorted(recipes) or 'none'})")


def precision_report(model, plan) -> dict:
    """JSON-able report (trainer: run_dir/precision_report.json and the tracker config)."""
    cfg = model.config
    base = plan.base  # the dtype every non-FP8 module ran in: "bf16" or "fp32"
    layers: dict[str, dict] = {}
    rb = plan.readback
    decisions = plan.decisions or {n: (k, False, plan.fallback_reason or "FP8 not requested")
                                   for n, k, _ in policy_modules(model)}
    for kind in KINDS:
        mods = [(fp8, why) for k, fp8, why in decisions.values() if k == kind]
        whys = sorted({why for _, why in mods})
        if rb is not None:
            fp8_n, other_n = rb["layers"][kind]["fp8"], rb["layers"][kind][base]
        else:
            fp8_n = sum(1 for fp8, _ in mods if fp8) if plan.fp8_enabled else 0
            other_n = len(mods) - fp8_n
        layers[kind] = {"fp8": fp8_n, base: other_n, "why": "; ".join(whys)}
    layers["lm_head"] = {"fp8": 0, base: 1, "why": LM_HEAD_WHY}
    f = plan.facts
    return {
        "precision": plan.label, "base": base, "base_dtype": base, "fp8_requested": plan.args.use_fp8,
        "fp8": plan.fp8_enabled,
        "fallback_reason": plan.fallback_reason, "backend": getattr(cfg, "backend", "torch"),
        "layers": layers, "layers_source": "te" if rb is not None else ("plan" if plan.fp8_enabled else "n/a"),
        "non_fp8_precision": base.upper(),
        "configured_recipe": {"name": plan.recipe_name, "kwargs": plan.recipe_kwargs,
                              "fp8_interval_recorded": plan.args.fp8_interval} if plan.fp8_enabled else None,
        "te_readback": rb, "device": f.device_name,
        "compute_capability": ".".join(map(str, f.compute_capability)) if f.compute_capability else None,
        "te_version": f.te_version, "fp8_min_gemm_dim": plan.args.fp8_min_gemm_dim,
        "fp8_keep_bf16": plan.args.fp8_keep_bf16, "fp8_eval": plan.args.fp8_eval,
        "sharding": getattr(plan, "sharding", None), "fp8_weight_cache": getattr(plan, "cache_fp8_weights", True),
    }


def format_report(rep: dict) -> str:
    where = f", {rep['device']} cc {rep['compute_capability']}" if rep.get("device") else ""
    lines = [f"precision: {rep['precision']} (backend {rep['backend']}{where})"]
    if rep["fp8_requested"] and not rep["fp8"]:
        lines.append(f"  FP8 requested but off: {rep['fallback_reason']}")
    base = rep.get("base_dtype", rep["base"])
    other = base.upper()
    for kind, d in rep["layers"].items():
        label = "mlp(fc1+fc2)" if kind == "mlp" else kind
        lines.append(f"  {label:<12} FP8 {d['fp8']:>3} | {other} {d[base]:>3}   {d['why']}")
    if rep["fp8"]:
        rc = rep["configured_recipe"]
        lines.append(f"  configured: {rc['name']}({', '.join(f'{k}={v}' for k, v in rc['kwargs'].items())})"
                     + (", eval in FP8" if rep.get("fp8_eval") else ", eval in " + other))
        rb = rep.get("te_readback")
        lines.append("  TE read-back: " + (
            f"fp8={rb['fp8_enabled']} recipe={rb['recipe']} format={rb['fp8_format']} "
            f"modules in FP8 {rb['fp8_modules']}/{rb['fp8_modules_planned']} -> "
            + ("confirmed" if rb["fp8_confirmed"] else "NOT confirmed")
            if rb else "pending (recorded during the first training forward)"))
    return "\n".join(lines)
