"""The training loss of `YxanulForCausalLM`: cross entropy + an optional penalty, three implementations.

Penalties (``penalty_type``, weight λ = ``penalty_weight``; "mean" is over the non-ignored targets, or
the sum divided by ``num_items_in_batch`` when transformers' Trainer passes it):

- ``z_loss``: λ · mean(log Z²), log Z = logsumexp of the token's logits. Keeps the softmax
  normaliser near 0 so the logits do not drift (PaLM, Chowdhery et al. 2022, §5 "z_loss", λ = 1e-4;
  OLMo 2, OLMo et al. 2024). log Z comes from what the CE already computed: CE = log Z - x_target,
  so log Z = CE + x_target (one gather per token, no second (B,T,V) pass).
- ``max_z_loss``: λ · mean(z_max²), z_max = the token's largest logit. Baichuan 2 (Yang et al.
  2023, §2.6 "Max-z loss", λ = 2e-4) uses it to stop logits growing, which made inference
  sensitive to repetition penalties. Its gradient (2λ·z_max at the arg-max logit) needs the
  arg-max index: the chunked loss gets it free from its own logsumexp; "default"/"te" read it
  with one argmax over the logits in their own dtype (bf16 under autocast; no fp32 copy).

``loss_impl``:

- ``default``: logits (B,T,V) -> fp32 -> cross entropy, today's numbers. Without a penalty it is
  transformers' own ``ForCausalLMLoss`` (``model.loss_function``); with one, ``log_softmax`` +
  ``nll_loss``, which is exactly what ``F.cross_entropy`` computes (bit for bit), keeping log p.
- ``chunked``: linear + cross entropy over chunks of tokens, never holding (B,T,V) logits: each
  chunk's gradients are computed in the forward (Liger Kernel's fused-linear-CE scheme; backward
  only scales them), so there is no recompute. Written here because Liger/Cut-CE are CUDA/Triton only.
- ``te``: Transformer Engine's ``parallel_cross_entropy`` (BF16 logits in, fp32 math, the gradient
  written in place into the logits; CUDA only).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def _reduce(per_token: torch.Tensor, denom) -> torch.Tensor:
    return per_token.sum() / denom


def _penalty(kind: str, weight: float, lse, zmax, valid, denom) -> torch.Tensor:
    """λ · mean over valid tokens of log Z² (z_loss) or z_max² (max_z_loss); (N,) inputs."""
    if kind == "none":
        return torch.zeros((), device=valid.device)
    term = lse if kind == "z_loss" else zmax
    return weight * _reduce(term.to(torch.promote_types(term.dtype, torch.float32)).pow(2) * valid, denom)


def _arg_max_logit(logits: torch.Tensor) -> torch.Tensor:
    """(N, V) -> (N,) the largest logit, differentiable (gradient one-hot at the arg-max), read in
    the logits' own dtype; gathered so nothing of the (N, V) tensor is saved for backward."""
    idx = logits.detach().argmax(-1, keepdim=True)          # (N, 1)
    return logits.gather(-1, idx).squeeze(-1)                # (N,)


def _denominator(valid: torch.Tensor, num_items_in_batch):
    """Mean over valid targets, or transformers' Trainer normalisation (sum / num_items_in_batch)."""
    if num_items_in_batch is None:
        return valid.sum()
    return num_items_in_batch.to(valid.device) if torch.is_tensor(num_items_in_batch) else num_items_in_batch


def loss_from_logits(logits, targets, penalty_type="none", penalty_weight=0.0, num_items_in_batch=None):
    """``default`` with a penalty: logits (B,T,V) or (N,V), aligned targets -> (loss, lm_loss, penalty).
    lm_loss == F.cross_entropy(logits.float(), targets) bit for bit (same log_softmax + nll_loss)."""
    V = logits.size(-1)
    x = logits.reshape(-1, V)
    xf = x.to(torch.promote_types(x.dtype, torch.float32))                  # (N, V): today's fp32 copy
    t = targets.reshape(-1).to(x.device)
    logp = F.log_softmax(xf, -1)                                            # (N, V)
    valid = t != IGNORE_INDEX
    denom = _denominator(valid, num_items_in_batch)
    red = "mean" if num_items_in_batch is None else "sum"
    lm = F.nll_loss(logp, t, ignore_index=IGNORE_INDEX, reduction=red)
    lm = lm if num_items_in_batch is None else lm / denom
    safe = t.clamp(min=0)[:, None]                                          # (N, 1)
    lse = (xf.gather(1, safe) - logp.gather(1, safe)).squeeze(1)            # log Z = x_t - log p_t, (N,)
    zmax = _arg_max_logit(x) if penalty_type == "max_z_loss" else None
    pen = _penalty(penalty_type, penalty_weight, lse, zmax, valid, denom)
    return lm + pen, lm, pen


def te_loss(logits, targets, parallel_cross_entropy, penalty_type="none", penalty_weight=0.0,
            num_items_in_batch=None):
    """``te``: TE's ``parallel_cross_entropy`` (per-token fp32 CE, 0 at ignored targets; its backward
    writes the gradient into ``logits``, so everything read from the logits is gathered first)."""
    B, T, V = logits.shape
    t = targets.reshape(B, T).to(logits.device)
    valid = (t != IGNORE_INDEX).reshape(-1)
    x_t = logits.gather(-1, t.clamp(min=0)[..., None]).reshape(-1).float()   # (N,)
    zmax = _arg_max_logit(logits.reshape(-1, V)) if penalty_type == "max_z_loss" else None
    ce = parallel_cross_entropy(logits, t, 0.0, False, None, IGNORE_INDEX).reshape(-1)  # (N,) fp32
    denom = _denominator(valid, num_items_in_batch)
    lm = _reduce(ce, denom)
    pen = _penalty(penalty_type, penalty_weight, ce + x_t, zmax, valid, denom)  # log Z = CE + x_t
    return lm + pen, lm, pen


MIN_CHUNK_TOKENS = 1024  # (1024, V) fp32 logits: 206 MB at V = 50,304


def chunk_size(n_tokens: int, hidden: int, vocab: int) -> int:
    """Tokens per chunk so that a chunk's logits (chunk, V) are about the size of the hidden states
    (N, C) — Liger Kernel's rule, ceil(N / ceil(V / C)) — but at least ``MIN_CHUNK_TOKENS``: every chunk
    also adds a (V, C) weight gradient, which dominates when narrow models make the chunks tiny (nano,
    C = 256: 3 tokens a chunk, 16x slower than the default loss on a CPU)."""
    return max(1, -(-n_tokens // -(-vocab // hidden)), min(n_tokens, MIN_CHUNK_TOKENS))


class _ChunkedLinearCE(torch.autograd.Function):
    """Loss of ``F.linear(h, weight)`` against ``targets`` chunk by chunk; each chunk's logits live
    only inside the loop. The gradients w.r.t. h and weight are computed in the forward (for the
    total loss); backward scales them by the incoming gradient."""

    @staticmethod
    def forward(ctx, h, weight, targets, denom, kind, lam, chunk, dtype, need_grad):
        N = h.shape[0]
        acc = torch.promote_types(dtype, torch.float32)           # fp32 math (fp64 in gradcheck)
        w = weight.to(dtype)
        grad_h = torch.empty(h.shape, dtype=h.dtype, device=h.device) if need_grad else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=h.device) if need_grad else None
        sums = torch.zeros(2, dtype=acc, device=h.device)          # [lm, penalty/λ]
        for s in range(0, N, chunk):
            hc, tc = h[s:s + chunk].to(dtype), targets[s:s + chunk]
            x = F.linear(hc, w).to(acc)                            # (n, V) fp32
            valid = (tc != IGNORE_INDEX).to(acc)
            safe = tc.clamp(min=0)[:, None]
            lse = torch.logsumexp(x, -1)                           # (n,)
            zmax, arg = x.max(-1)                                  # (n,) each
            term = lse if kind == "z_loss" else zmax
            sums[0] += ((lse - x.gather(1, safe).squeeze(1)) * valid).sum()
            if kind != "none":
                sums[1] += (term.pow(2) * valid).sum()
            if need_grad:  # d total / d x = valid/denom · [softmax - onehot(t) + 2λ·term·(softmax | onehot(arg))]
                coef = valid / denom                               # (n,)
                g = (x - lse[:, None]).exp_()                      # softmax, reusing no extra (n, V)
                g.mul_((coef * (1 + 2 * lam * lse) if kind == "z_loss" else coef)[:, None])
                g.scatter_add_(1, safe, -coef[:, None])
                if kind == "max_z_loss":
                    g.scatter_add_(1, arg[:, None], (2 * lam * zmax * coef)[:, None])
                g = g.to(dtype)
                grad_h[s:s + chunk] = (g @ w).to(h.dtype)          # (n, C)
                grad_w += (g.t() @ hc).to(acc)                     # (V, C)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        lm, pen = sums[0] / denom, lam * sums[1] / denom
        ctx.mark_non_differentiable(lm, pen)
        return lm + pen, lm, pen

    @staticmethod
    def backward(ctx, grad_total, _grad_lm, _grad_pen):
        grad_h, grad_w = ctx.saved_tensors
        return (grad_h * grad_total.to(grad_h.dtype), (grad_w * grad_total).to(ctx.weight_dtype),
                None, None, None, None, None, None, None)


def chunked_loss(h, weight, targets, penalty_type="none", penalty_weight=0.0, num_items_in_batch=None,
                 chunk=None):
    """``chunked``: hidden states h (B,T,C) or (N,C), LM head ``weight`` (V,C), aligned targets ->
    (loss, lm_loss, penalty); only ``loss`` carries gradients. Matmuls run in the autocast dtype
    when autocast is on (as the LM head would), softmax/CE in fp32."""
    C = h.size(-1)
    hf = h.reshape(-1, C)
    t = targets.reshape(-1).to(h.device)
    dev = h.device.type
    dtype = (torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev)
             else torch.promote_types(h.dtype, weight.dtype))
    denom = _denominator(t != IGNORE_INDEX, num_items_in_batch)
    denom = denom.to(torch.promote_types(dtype, torch.float32)) if torch.is_tensor(denom) else float(denom)
    need_grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    chunk = chunk or chunk_size(hf.shape[0], C, weight.shape[0])
    with torch.autocast(dev, enabled=False):
        return _ChunkedLinearCE.apply(hf, weight, t, denom, penalty_type, float(penalty_weight), chunk, dtype,
                                      need_grad)
