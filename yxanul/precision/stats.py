"""FP8 scaling statistics for logging steps: delayed-scaling state, and FP8 weight scales of every recipe.

Delayed scaling. TE 2.20 keeps, per TE module, `fp8_meta["scaling_fwd"|"scaling_bwd"]` = a
`DelayedScalingRecipeState` with `scale` [n] and `amax_history` [amax_history_len, n]
(`quantization.py`). Slot 0 of the history is the amax being recorded now: after each update TE
rolls the history and zeroes slot 0 (`_update_amax_history`), so between steps the latest amax sits
in the last row. We report, per tensor slot, the amax TE's scale is computed from: the max over the
history for amax_compute_algo="max" (and as a robust summary otherwise). Slots a module never fills
(e.g. the GEMM output slot) have amax 0 and scale 1 and are left out -> `scale_*`, `amax_*`, `tensors`.

Every recipe (the stateless ones too: current, block, MXFP8). Activation scales of stateless recipes
are computed inside each GEMM's cast and kept nowhere. What TE does keep is the FP8 copy of each
weight, cached in `module._fp8_workspaces` while `is_first_microbatch` is passed (yxanul always
passes it). Its scale-inverse is read per storage class of `tensor/storage/`:
- `Float8TensorStorage` (delayed, current): `_scale_inv` [1];
- `MXFP8TensorStorage`: E8M0 exponents (uint8, 2**(e-127), 255 = NaN) per 32 values; rowwise
  [M, K/32] padded to [128, 4] multiples, columnwise [M/32, K] padded to [4, 128]. Padding is
  uninitialised: the logical corner is used, or, when the scales are already GEMM-swizzled and
  padded, the tensor is skipped (swizzling scatters the padding);
- `Float8BlockwiseQTensorStorage`: float32 per 128x128 block (2D: [ceil(M/128), ceil(K/128)]
  padded to 4 columns) or per 1x128 (1D: [ceil(K/128), M] padded to 4 columns), the layout
  `_dequantize_vectorwise` / `format_scale_as_logical_shape` read.
-> `weight_scale_{min,median,max}` (scale = 1/scale_inv: min of the per-tensor minima, median of the
per-tensor medians, max of the maxima) and `weight_tensors`. `nonfinite` counts NaN/inf in both.

Cost: small reductions queued on device, concatenated, ONE device->host copy, the rest on CPU.
Call it on logging steps only.
"""

from __future__ import annotations

import math

import torch

KEYS = ("scale_min", "scale_median", "scale_max", "amax_min", "amax_median", "amax_max", "tensors",
        "weight_scale_min", "weight_scale_median", "weight_scale_max", "weight_tensors", "nonfinite")

MXFP8_BLOCK, BLOCK = 32, 128


def _data_and_scale_inv(ws):
    if getattr(ws, "_rowwise_data", None) is not None and getattr(ws, "_rowwise_scale_inv", None) is not None:
        return ws._rowwise_data, ws._rowwise_scale_inv, True
    if getattr(ws, "_columnwise_data", None) is not None and getattr(ws, "_columnwise_scale_inv", None) is not None:
        return ws._columnwise_data, ws._columnwise_scale_inv, False
    return None, None, None


def weight_scale_inv(ws) -> torch.Tensor | None:
    """The scale-inverses of one cached FP8 weight, over its real blocks only (float32, 1-D), or None."""
    if hasattr(ws, "_with_gemm_swizzled_scales"):  # MXFP8
        data, sinv, rowwise = _data_and_scale_inv(ws)
        if data is None or data.dim() == 0:
            return None
        m, k = math.prod(data.shape[:-1]), data.shape[-1]
        rows, cols = (m, k // MXFP8_BLOCK) if rowwise else (m // MXFP8_BLOCK, k)
        if ws._with_gemm_swizzled_scales:
            if sinv.numel() != rows * cols:
                return None
            valid = sinv.flatten()
        else:
            valid = sinv.reshape(-1, sinv.shape[-1])[:rows, :cols].flatten()
        e = valid.to(torch.float32)
        return torch.where(e == 255, torch.full_like(e, float("nan")), torch.exp2(e - 127.0))
    if hasattr(ws, "_is_2D_scaled"):  # Float8 block scaling
        data, sinv, rowwise = _data_and_scale_inv(ws)
        if data is None or data.dim() == 0 or sinv.dim() != 2:
            return None
        if rowwise:
            m, k = math.prod(data.shape[:-1]), data.shape[-1]
        else:
            m, k = data.shape[0], math.prod(data.shape[1:])
        valid = sinv[:, :math.ceil(k / BLOCK)] if ws._is_2D_scaled else sinv[:, :m]
        return valid.float().flatten()
    sinv = getattr(ws, "_scale_inv", None)  # Float8 per-tensor (delayed, current)
    return sinv.detach().float().flatten() if torch.is_tensor(sinv) else None


def _summary(sinv: torch.Tensor) -> torch.Tensor:
    """[min, median, max, #nonfinite] of scale = 1/scale_inv on device: no host sync."""
    scale = sinv.reciprocal()
    ok = torch.isfinite(scale)
    inf, nan = torch.full_like(scale, float("inf")), torch.full_like(scale, float("nan"))
    return torch.stack([torch.where(ok, scale, inf).amin(), torch.where(ok, scale, nan).nanmedian(),
                        torch.where(ok, scale, -inf).amax(), (~ok).sum().to(scale.dtype)])


def fp8_stats(model) -> dict[str, float]:
    scales, amaxes, weights = [], [], []
    for m in model.modules():
        meta = getattr(m, "fp8_meta", None)
        if isinstance(meta, dict):
            for key in ("scaling_fwd", "scaling_bwd"):
                st = meta.get(key)
                scale, hist = getattr(st, "scale", None), getattr(st, "amax_history", None)
                if torch.is_tensor(scale) and torch.is_tensor(hist):
                    scales.append(scale.detach().float().flatten())
                    h = hist.detach().float()
                    amaxes.append((h.amax(dim=0) if h.dim() > 1 else h).flatten())
        for ws in (getattr(m, "_fp8_workspaces", None) or {}).values():
            sinv = weight_scale_inv(ws)
            if sinv is not None and sinv.numel():
                weights.append(_summary(sinv.detach()))
    if not (scales or weights):
        return {}
    n, w = sum(s.numel() for s in scales), len(weights)
    host = torch.cat([t.float().flatten() for t in scales + amaxes + weights]).cpu()  # the one transfer
    delayed, weight = _delayed(host[:n], host[n:2 * n]), _weights(host[2 * n:].reshape(w, 4))
    return {**delayed, **weight, "nonfinite": delayed.get("nonfinite", 0.0) + weight.get("nonfinite", 0.0)}


def _delayed(s: torch.Tensor, a: torch.Tensor) -> dict[str, float]:
    if s.numel() == 0:
        return {}
    nonfinite = int((~torch.isfinite(s)).sum() + (~torch.isfinite(a)).sum())
    used = torch.isfinite(a) & (a > 0)
    s_used, a_used = s[used & torch.isfinite(s)], a[used]
    if s_used.numel() == 0:
        return {"nonfinite": float(nonfinite), "tensors": 0.0}
    return {"scale_min": s_used.min().item(), "scale_median": s_used.median().item(),
            "scale_max": s_used.max().item(), "amax_min": a_used.min().item(),
            "amax_median": a_used.median().item(), "amax_max": a_used.max().item(),
            "nonfinite": float(nonfinite), "tensors": float(s_used.numel())}


def _weights(rows: torch.Tensor) -> dict[str, float]:
    if rows.numel() == 0:
        return {}
    nonfinite, real = float(rows[:, 3].sum()), rows[torch.isfinite(rows[:, 0])]
    out = {"weight_tensors": float(real.shape[0]), "nonfinite": nonfinite}
    if real.shape[0]:
        out.update(weight_scale_min=real[:, 0].min().item(), weight_scale_median=real[:, 1].median().item(),
                   weight_scale_max=real[:, 2].max().item())
    return out
