"""Activation memory of a training step: a per-token formula derived from the torch backend's ops,
and the measurement it is checked against (the tensors autograd really saves, through
``torch.autograd.graph.saved_tensors_hooks``, on a small model on the CPU).

What the formula counts, per decoder layer and token, BF16 autocast (C hidden, F ffn, KV = kv heads x
head dim, H heads; bytes):

- each RMSNorm (2 per layer) saves its fp32 input copy and the normalized fp32 product: 8C, + 4 (the
  fp32 reciprocal RMS); the first layer's fp32 copy is the fp32 embedding output itself;
- attention: the bf16 normalized input of the q/k/v GEMMs 2C, q after RoPE 2C, k 2KV, v 2KV, the
  attention output 2C (also the output projection's input: SDPA returns it token-major, so the
  transpose + reshape is a view) and its fp32 log-sum-exp 4H (flash-style SDPA: no T x T matrix);
- MLP: the bf16 normalized input 2C, the fc1 output [gate; up] 4F, silu(gate) 2F, the fc2 input 2F.

Together 24C + 8F + 4KV + 4H + 8 per layer and token. Outside the layers: the final norm 8C + 4, the
LM head's bf16 input 2C, the int64 inputs and targets 16, and the loss (``loss_bytes``). With activation
checkpointing each layer keeps only its input (bf16 2C; the first one the fp32 embedding, 4C) and one
layer's activations are rebuilt at a time in backward.

The loss, by ``loss_impl`` (V: the padded vocabulary; both backends run the same loss code):

- ``default``: the fp32 log-probabilities 4V saved, and on top at the start of backward 8V (the fp32
  gradient of the log-probabilities and the one log_softmax returns, live together; more than forward's
  transient bf16 logits + fp32 copy, 6V): 12V at the peak;
- ``te`` (TE backend): TE's cross entropy keeps the BF16 logits, into which it writes their gradient in
  the forward, 2V, and the peak holds one more BF16 (N, V) tensor, 4V in all (2026-11-26 H200 peaks: 8.0 bytes
  per token and vocabulary entry below ``default`` at gpt2-124m, medium and xlarge);
- ``chunked``: no (N, V) tensor; the gradient of the hidden states, computed in the forward, takes the
  LM-head input's place (BF16, 2C); the head weight's fp32 gradient 4VC saved, no targets and no BF16
  copy of the head weight (``memory.py`` leaves it out of the casts); a chunk's logits, their fp32 copy,
  softmax and BF16 gradient (12 bytes per chunk token and vocabulary entry) and the head weight's BF16
  copy 2VC transient (`models/loss.py`).

**The TE backend** (``backend="te"``: `te.TransformerLayer` blocks, cuDNN attention), per layer and token,
from TE 2.20's ``save_for_backward`` lists: the q/k/v LayerNormLinear keeps its BF16 input 2C, its
normalized output 2C and the fp32 1/rms 4; attention keeps the rotated q 2C and k 2KV, a contiguous v
2KV, its output 2C (also the projection's input) and the fp32 softmax statistics 4H; LayerNormMLP keeps
its input 2C, normalized output 2C, fc1 output [gate; up] 4F, the SwiGLU output 2F and 1/rms 4:
12C + 4KV + 6F + 4H + 8. In FP8 (delayed scaling) the SwiGLU output is kept as fc2's FP8 input, 1 byte:
F less (the H200 peaks: FP8 below BF16 by F per layer and token within 1.5 % at three widths; the norm
outputs' FP8 copies save nothing measurable). Outside: the final norm's BF16 input 2C and 1/rms 4, the LM
head's BF16 input 2C (``chunked``: its gradient instead), the int64 inputs and targets 16. Checked against the committed
H200 peaks (`tests/planning/test_measured_peak.py`, within 15 %).

Per step, independent of tokens: autocast's bf16 copies of the fp32 matmul weights (2 bytes per
matmul parameter, held from forward to backward) when the parameters are fp32, and RoPE's cos/sin
tables (4 x T x head_dim fp32 per layer).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Activations:
    """Bytes for one micro-batch of ``tokens`` tokens (micro x seq_length)."""

    saved: int        # kept from forward to backward (what saved_tensors_hooks sees, minus weight casts)
    loss_peak: int    # transient at the loss (start of backward), on top of ``saved``
    recompute: int    # checkpointing only: one layer's activations rebuilt during backward


def layer_bytes_per_token(c, backend: str = "torch", fp8: bool = False) -> int:
    """Bytes one decoder layer saves per token (module docstring)."""
    C, F, H = c.hidden_size, c.intermediate_size, c.num_attention_heads
    KV = c.num_key_value_heads * c.head_dim
    if backend == "te":
        return 12 * C + 4 * KV + 6 * F + 4 * H + 8 - (F if fp8 else 0)
    return 24 * C + 8 * F + 4 * KV + 4 * H + 8


def outside_bytes_per_token(c, backend: str = "torch", loss_impl: str = "default") -> int:
    """Final norm, LM-head input (``chunked``: the gradient of the same (N, C) BF16 tensor instead), int64
    inputs and targets (``chunked`` keeps no targets), per token; not the loss."""
    norm = 2 * c.hidden_size + 4 if backend == "te" else 8 * c.hidden_size + 4
    return norm + 2 * c.hidden_size + (8 if loss_impl == "chunked" else 16)


def loss_bytes(c, tokens: int, loss_impl: str = "default") -> tuple[int, int]:
    """(saved, transient peak on top) of the loss of ``tokens`` tokens (module docstring)."""
    V, C = c.vocab_size, c.hidden_size
    if loss_impl == "default":
        return 4 * V * tokens, 8 * V * tokens
    if loss_impl == "te":
        return 2 * V * tokens, 2 * V * tokens
    from ..models.loss import chunk_size  # torch: the one chunk rule, the loss's own

    return 4 * V * C, 12 * chunk_size(tokens, C, V) * V + 2 * V * C


def rope_bytes(c, seq_length: int, backend: str = "torch") -> int:
    """cos and sin of q and k, fp32 [T, head_dim], per layer (independent of the micro-batch); TE's blocks
    share one table of angles, outside these totals (T x head_dim fp32: kilobytes)."""
    return 0 if backend == "te" else c.num_hidden_layers * 4 * seq_length * c.head_dim * 4


def activations(c, micro: int, seq_length: int, checkpointing: bool = False, *, backend: str = "torch",
                fp8: bool = False, loss_impl: str = "default") -> Activations:
    """The activation bytes of a micro-batch (``c``: a YxanulConfig; ``backend`` torch or te; ``fp8``: TE's
    FP8 delayed scaling)."""
    n = micro * seq_length
    layer = layer_bytes_per_token(c, backend, fp8) * n
    outside = outside_bytes_per_token(c, backend, loss_impl) * n
    loss_saved, loss_peak = loss_bytes(c, n, loss_impl)
    rope = rope_bytes(c, seq_length, backend)
    if checkpointing:
        kept = (4 + 2 * (c.num_hidden_layers - 1)) * c.hidden_size * n  # each layer's input
        return Activations(kept + outside + loss_saved, loss_peak, layer + rope // c.num_hidden_layers)
    return Activations(c.num_hidden_layers * layer + outside + loss_saved + rope, loss_peak, 0)


@contextlib.contextmanager
def saved_tensor_bytes(exclude=()):
    """Count the bytes of the distinct storages autograd saves inside the block (``exclude``: tensors
    whose storages don't count, e.g. the parameters). Yields a dict filled as the block runs:
    ``{"bytes": total, "tensors": [(shape, dtype, bytes), ...]}``."""
    import torch

    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: set[int] = set()
    out = {"bytes": 0, "tensors": []}

    def pack(t):
        s = t.untyped_storage()
        key = s.data_ptr()
        if key not in skip and key not in seen:
            seen.add(key)
            out["bytes"] += s.nbytes()
            out["tensors"].append((tuple(t.shape), t.dtype, s.nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield out


def measure_saved(model, micro: int, seq_length: int, dtype=None) -> dict:
    """Run one real forward (with the loss) of ``model`` on random tokens under ``dtype`` autocast
    (None: none) and return what autograd saved: ``{"bytes", "tensors"}``. The parameters are
    excluded; autocast's weight copies are included (they are saved too)."""
    import torch

    device = next(model.parameters()).device
    x = torch.randint(0, model.config.vocab_size, (micro, seq_length), device=device)
    ctx = torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
    with saved_tensor_bytes(exclude=list(model.parameters())) as got, ctx:
        out = model(x, labels=x, return_logits=False)
    out.loss.backward()
    model.zero_grad(set_to_none=True)
    return got
