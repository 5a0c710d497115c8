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
LM head's bf16 input 2C, the loss's fp32 log-probabilities 4V, the int64 inputs and targets 16. At
the loss, on top: 8V at the start of backward (the fp32 gradient of the log-probabilities and the
one log_softmax returns, live together; more than forward's transient bf16 logits + fp32 copy, 6V). With activation
checkpointing each layer keeps only its input (bf16 2C; the first one the fp32 embedding, 4C) and one
layer's activations are rebuilt at a time in backward.

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


def layer_bytes_per_token(c) -> int:
    """Bytes one decoder layer saves per token (module docstring)."""
    C, F, H = c.hidden_size, c.intermediate_size, c.num_attention_heads
    KV = c.num_key_value_heads * c.head_dim
    return 24 * C + 8 * F + 4 * KV + 4 * H + 8


def outside_bytes_per_token(c) -> int:
    """Final norm, LM-head input, fp32 log-probabilities, int64 inputs and targets, per token."""
    return (8 * c.hidden_size + 4) + 2 * c.hidden_size + 4 * c.vocab_size + 16


def rope_bytes(c, seq_length: int) -> int:
    """cos and sin of q and k, fp32 [T, head_dim], per layer (independent of the micro-batch)."""
    return c.num_hidden_layers * 4 * seq_length * c.head_dim * 4


def activations(c, micro: int, seq_length: int, checkpointing: bool = False) -> Activations:
    """The activation bytes of a micro-batch (``c``: a YxanulConfig)."""
    n = micro * seq_length
    layer = layer_bytes_per_token(c) * n
    if checkpointing:
        kept = (4 + 2 * (c.num_hidden_layers - 1)) * c.hidden_size * n  # each layer's input
        saved = kept + outside_bytes_per_token(c) * n
        return Activations(saved, 8 * c.vocab_size * n, layer + rope_bytes(c, seq_length) // c.num_hidden_layers)
    saved = c.num_hidden_layers * layer + outside_bytes_per_token(c) * n + rope_bytes(c, seq_length)
    return Activations(saved, 8 * c.vocab_size * n, 0)


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
