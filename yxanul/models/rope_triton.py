"""``rope_kernel: triton``: the q/k/v split of the packed QKV projection and the q/k rotation in one Triton
kernel per layer and direction, for ``fuse_qkv_rope`` (the projection grouped per KV head: (B, T, ng, (g + 2) * hd),
each group g query heads, then its key and value head).

Why not TE's kernel (``transformer_engine.pytorch.attention.rope.apply_fused_qkv_rope``, the ``te`` choice): it
moves one bf16 element per thread (warps of 32 along a 64-wide head, one block per token), and the H200 profile of
2026-11-27 measured it at ~150 µs for a 100 MB medium tensor each way, a third of the card's bandwidth
(docs/benchmarks.md). Here each program moves a (rows x half-head) tile per head with vector loads, and reads
cos/sin from tables computed once per call by torch (cosf/sinf, as TE's ``sincosf``; Triton's own sin/cos may
lower to the approximate instructions).

Non-interleaved rotation (rotate_half), full head: y = x * cos + rotate_half(x) * sin, in fp32, stored in the
input's dtype; backward is its transpose, dx = dy * cos + rotate_half^T(dy * sin).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_ROWS = 32  # (token, KV group) rows per program: 32 x 64 bf16 = 4 KB a head


@triton.jit
def _rope_tile(src, dst, src_off, dst_off, cos_lo, cos_hi, sin_lo, sin_hi, half, mask, ROTATE: tl.constexpr,
               INVERSE: tl.constexpr):
    lo = tl.load(src + src_off, mask=mask).to(tl.float32)                # (R, hd/2)
    hi = tl.load(src + src_off + half, mask=mask).to(tl.float32)         # (R, hd/2)
    if ROTATE:
        if INVERSE:  # dx_lo = dy_lo cos_lo + dy_hi sin_hi, dx_hi = dy_hi cos_hi - dy_lo sin_lo
            lo, hi = lo * cos_lo + hi * sin_hi, hi * cos_hi - lo * sin_lo
        else:  # y_lo = x_lo cos_lo - x_hi sin_lo, y_hi = x_hi cos_hi + x_lo sin_hi
            lo, hi = lo * cos_lo - hi * sin_lo, hi * cos_hi + lo * sin_hi
    tl.store(dst + dst_off, lo.to(dst.dtype.element_ty), mask=mask)
    tl.store(dst + dst_off + half, hi.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def _qkv_rope_kernel(packed, q, k, v, cos, sin, n_rows, T, NG, G: tl.constexpr, HD: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, BACKWARD: tl.constexpr):
    """Forward: packed (n_rows, (G + 2) * HD) -> q (n_rows, G * HD), k, v (n_rows, HD). Backward: the same
    tensors the other way (q, k, v hold the gradients, packed receives the input gradient). BLOCK_H: hd/2 up to a
    power of two (tl.arange's)."""
    HALF: tl.constexpr = HD // 2
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)             # (R,) = b * T * NG + t * NG + group
    cols = tl.arange(0, BLOCK_H)                                          # (hd/2 rounded up,)
    if BLOCK_H == HALF:
        mask = (rows < n_rows)[:, None]                                   # (R, 1): whole rows, vector access
    else:
        mask = (rows < n_rows)[:, None] & (cols < HALF)[None, :]          # (R, hd/2 rounded up)
    rows64 = rows.to(tl.int64)[:, None]
    t = ((rows // NG) % T)[:, None]
    table = t * HD + cols[None, :]                                        # (R, hd/2) into the (T, HD) tables
    cos_lo = tl.load(cos + table, mask=mask)
    cos_hi = tl.load(cos + table + HALF, mask=mask)
    sin_lo = tl.load(sin + table, mask=mask)
    sin_hi = tl.load(sin + table + HALF, mask=mask)
    width = (G + 2) * HD
    for j in tl.static_range(G + 2):                                      # the group's q heads, its k, its v
        packed_off = rows64 * width + j * HD + cols[None, :]
        if j < G:
            other, other_off = q, rows64 * (G * HD) + j * HD + cols[None, :]
        elif j == G:
            other, other_off = k, rows64 * HD + cols[None, :]
        else:
            other, other_off = v, rows64 * HD + cols[None, :]
        if BACKWARD:
            _rope_tile(other, packed, other_off, packed_off, cos_lo, cos_hi, sin_lo, sin_hi, HALF, mask,
                       ROTATE=j <= G, INVERSE=True)
        else:
            _rope_tile(packed, other, packed_off, other_off, cos_lo, cos_hi, sin_lo, sin_hi, HALF, mask,
                       ROTATE=j <= G, INVERSE=False)


def _launch(packed, q, k, v, cos, sin, g: int, backward: bool) -> None:
    B, T, ng, _ = packed.shape
    hd = k.shape[-1]
    n_rows = B * T * ng
    _qkv_rope_kernel[(triton.cdiv(n_rows, BLOCK_ROWS),)](packed, q, k, v, cos, sin, n_rows, T, ng, G=g, HD=hd,
                                                          BLOCK_R=BLOCK_ROWS, BLOCK_H=triton.next_power_of_2(hd // 2),
                                                          BACKWARD=backward, num_warps=4)


class FusedQKVRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, packed, freqs, g: int):
        B, T, ng, width = packed.shape                                    # (B, T, ng, (g + 2) * hd)
        hd = width // (g + 2)
        angles = freqs[:T].reshape(T, hd).float()                         # TE's [>= T, 1, 1, hd]
        cos, sin = angles.cos(), angles.sin()                             # (T, hd) fp32 each
        packed = packed.contiguous()
        q = packed.new_empty(B, T, ng * g, hd)
        k, v = packed.new_empty(B, T, ng, hd), packed.new_empty(B, T, ng, hd)
        _launch(packed, q, k, v, cos, sin, g, backward=False)
        ctx.save_for_backward(cos, sin)
        ctx.g, ctx.shape = g, packed.shape
        return q, k, v

    @staticmethod
    def backward(ctx, dq, dk, dv):
        cos, sin = ctx.saved_tensors
        dq, dk, dv = dq.contiguous(), dk.contiguous(), dv.contiguous()  # autograd materializes unused ones as zeros
        dpacked = dq.new_empty(ctx.shape)
        _launch(dpacked, dq, dk, dv, cos, sin, ctx.g, backward=True)
        return dpacked, None, None


def fused_qkv_rope(packed: torch.Tensor, freqs: torch.Tensor, g: int):
    """(B, T, ng, (g + 2) * hd) packed projection, freqs [T, 1, 1, hd] -> q (B, T, ng * g, hd), k, v (B, T, ng, hd),
    contiguous, q/k rotated: what TE's ``apply_fused_qkv_rope(..., tensor_format="bshd")`` returns, viewed."""
    return FusedQKVRope.apply(packed, freqs, g)
