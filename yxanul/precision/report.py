"""Precision report (what runs FP8, what BF16, and what TE says is in effect) and FP8 statistics."""

from __future__ import annotations

import torch


def precision_report(model, plan) -> dict:
    cfg = model.config
    n = cfg.num_hidden_layers
    layers = {}
    for kind in ("qkv", "proj", "mlp"):
        fp8, why = plan.policy.get(kind, (False, plan.fallback_reason or "FP8 not requested"))
        layers[kind] = {"fp8": n if fp8 and plan.fp8_enabled else 0, "bf16": 0 if fp8 and plan.fp8_enabled else n,
                        "why": why}
    layers["lm_head"] = {"fp8": 0, "bf16": 1, "why": "kept BF16 (output logits; tied embedding)"}
    rep = {
        "precision": plan.label, "base": plan.base, "fp8_requested": plan.args.use_fp8, "fp8": plan.fp8_enabled,
        "fallback_reason": plan.fallback_reason, "backend": cfg.backend, "layers": layers,
        "configured_recipe": plan.metadata().get("fp8_recipe_kwargs"),
        "te_readback": plan.readback, "device": plan.facts.device_name,
        "compute_capability": ".".join(map(str, plan.facts.compute_capability)) if plan.facts.compute_capability else None,
        "fp8_min_gemm_dim": plan.args.fp8_min_gemm_dim,
    }
    return rep


def format_report(rep: dict) -> str:
    lines = [f"precision: {rep['precision']} (backend {rep['backend']}"
             + (f", {rep['device']} cc {rep['compute_capability']}" if rep.get("device") else "") + ")"]
    if rep["fp8_requested"] and not rep["fp8"]:
        lines.append(f"  FP8 requested but off: {rep['fallback_reason']}")
    for kind, d in rep["layers"].items():
        lines.append(f"  {kind:<8} FP8 {d['fp8']:>3} | {rep['base'].upper()} {d['bf16']:>3}   {d['why']}")
    if rep["fp8"]:
        rb = rep.get("te_readback")
        lines.append("  TE read-back: " + (f"fp8={rb['fp8_enabled']} recipe={rb['recipe']} format={rb['fp8_format']}"
                                          if rb else "pending (read during the first training forward)"))
    return "\n".join(lines)


def fp8_stats(model) -> dict[str, float]:
    """Delayed scaling: min/median/max of scale and amax over all FP8 tensors, count of non-finite.
    One host transfer; call only on logging steps. Stateless recipes expose nothing: {}."""
    scales, amaxes = [], []
    for m in model.modules():
        meta = getattr(m, "fp8_meta", None)
        if not isinstance(meta, dict):
            continue
        for key in ("scaling_fwd", "scaling_bwd"):
            st = meta.get(key)
            if st is None or not hasattr(st, "scale"):
                continue
            scales.append(st.scale.float().flatten())
            hist = getattr(st, "amax_history", None)
            if hist is not None:
                amaxes.append(hist[0].float().flatten() if hist.dim() > 1 else hist.float().flatten())
    if not scales:
        return {}
    s = torch.cat(scales)
    a = torch.cat(amaxes) if amaxes else torch.zeros(1, device=s.device)
    stats = torch.stack([s.min(), s.median(), s.max(), a.min(), a.median(), a.max(),
                         (~torch.isfinite(s)).sum().float() + (~torch.isfinite(a)).sum().float()]).cpu().tolist()
    keys = ["scale_min", "scale_median", "scale_max", "amax_min", "amax_median", "amax_max", "nonfinite"]
    return dict(zip(keys, stats))
