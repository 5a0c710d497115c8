"""FP8 scaling statistics for logging steps (delayed scaling only).

TE 2.20 keeps, per TE module, `fp8_meta["scaling_fwd"|"scaling_bwd"]` = a `DelayedScalingRecipeState`
with `scale` [n] and `amax_history` [amax_history_len, n] (`quantization.py`). Slot 0 of the
history is the amax being recorded now: after each update TE rolls the history and zeroes slot 0
(`_update_amax_history`), so between steps the latest amax sits in the last row. We report, per
tensor slot, the amax TE's scale is computed from: the max over the history for
amax_compute_algo="max" (and as a robust summary otherwise). Slots a module never fills (e.g. the GEMM
output slot) have amax 0 and scale 1 and are left out. Stateless recipes (current, block, MXFP8)
keep no such state: {}.

Cost: a list of small device tensors concatenated on device, ONE device->host copy, the rest on CPU.
Call it on logging steps only.
"""

from __future__ import annotations

import torch

KEYS = ("scale_min", "scale_median", "scale_max", "amax_min", "amax_median", "amax_max", "nonfinite", "tensors")


def fp8_stats(model) -> dict[str, float]:
    scales, amaxes = [], []
    for m in model.modules():
        meta = getattr(m, "fp8_meta", None)
        if not isinstance(meta, dict):
            continue
        for key in ("scaling_fwd", "scaling_bwd"):
            st = meta.get(key)
            scale, hist = getattr(st, "scale", None), getattr(st, "amax_history", None)
            if not (torch.is_tensor(scale) and torch.is_tensor(hist)):
                continue
            scales.append(scale.detach().float().flatten())
            h = hist.detach().float()
            amaxes.append((h.amax(dim=0) if h.dim() > 1 else h).flatten())
    if not scales:
        return {}
    n = sum(s.numel() for s in scales)
    host = torch.cat(scales + amaxes).cpu()  # the one device->host transfer
    s, a = host[:n], host[n:]
    nonfinite = int((~torch.isfinite(s)).sum() + (~torch.isfinite(a)).sum())
    used = torch.isfinite(a) & (a > 0)
    s_used, a_used = s[used & torch.isfinite(s)], a[used]
    if s_used.numel() == 0:
        return {"nonfinite": float(nonfinite), "tensors": 0.0}
    return {"scale_min": s_used.min().item(), "scale_median": s_used.median().item(),
            "scale_max": s_used.max().item(), "amax_min": a_used.min().item(),
            "amax_median": a_used.median().item(), "amax_max": a_used.max().item(),
            "nonfinite": float(nonfinite), "tensors": float(s_used.numel())}
