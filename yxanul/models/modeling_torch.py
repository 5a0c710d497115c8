"""Torch backend of the decoder block: plain PyTorch twins of Transformer Engine's modules, with TE's
module tree and parameter names (``self_attention.layernorm_qkv.{layer_norm_weight,query_weight,
key_weight,value_weight}``, ``self_attention.proj.weight``, ``layernorm_mlp.{layer_norm_weight,
fc1_weight,fc2_weight}``), so a checkpoint moves between backends with no renaming. The TE backend
is ``modeling_te.py``. Attention takes transformers' KV ``Cache`` (generation)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer

from .configuration_yxanul import YxanulConfig

_SDPA_HAS_GQA = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm like TE's kernel: normalized and scaled in fp32, rounded once to the input dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


class RMSNorm(nn.Module):
    """Twin of ``te.RMSNorm`` (final norm)."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class LayerNormQKV(nn.Module):
    """Twin of ``te.LayerNormLinear(normalization="RMSNorm", parameters_split=q/k/v, bias=False)``."""

    def __init__(self, config: YxanulConfig):
        super().__init__()
        h, kv = config.hidden_size, config.num_key_value_heads * config.head_dim
        self.eps = config.rms_norm_eps
        self.layer_norm_weight = nn.Parameter(torch.ones(h))
        self.query_weight = nn.Parameter(torch.empty(h, h))
        self.key_weight = nn.Parameter(torch.empty(kv, h))
        self.value_weight = nn.Parameter(torch.empty(kv, h))

    def forward(self, x):  # x (B, T, C) -> q (B, T, C), k/v (B, T, n_kv*hd)
        x = rms_norm(x, self.layer_norm_weight, self.eps)
        return F.linear(x, self.query_weight), F.linear(x, self.key_weight), F.linear(x, self.value_weight)


class Linear(nn.Module):
    """Twin of ``te.Linear(bias=False)``."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))

    def forward(self, x):
        return F.linear(x, self.weight)


class LayerNormMLP(nn.Module):
    """Twin of ``te.LayerNormMLP(normalization="RMSNorm", activation="swiglu", bias=False)``:
    ``fc1_weight = cat([gate, up])`` and SiLU applies to the first (gate) half."""

    def __init__(self, config: YxanulConfig):
        super().__init__()
        h, f = config.hidden_size, config.intermediate_size
        self.eps = config.rms_norm_eps
        self.layer_norm_weight = nn.Parameter(torch.ones(h))
        self.fc1_weight = nn.Parameter(torch.empty(2 * f, h))
        self.fc2_weight = nn.Parameter(torch.empty(h, f))

    def forward(self, x):
        x = rms_norm(x, self.layer_norm_weight, self.eps)          # (B, T, C)
        gate, up = F.linear(x, self.fc1_weight).chunk(2, dim=-1)   # (B, T, F) each
        return F.linear(F.silu(gate) * up, self.fc2_weight)        # (B, T, C)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """x (B, T, nh, hd), freqs [T, 1, 1, hd] in TE's layout (non-interleaved, like HF Llama), or (B, T, hd)
    per sequence (explicit ``position_ids``)."""
    f = freqs[:, :, None, :] if freqs.dim() == 3 else freqs[:, 0, 0, :][None, :, None, :]  # (B|1, T, 1, hd)
    xf = x.float()
    return (xf * f.cos() + rotate_half(xf) * f.sin()).to(x.dtype)


def eager_attention(q, k, v, allowed):
    """softmax(q k^T / sqrt(hd) + mask) v in fp32 softmax, as transformers' eager attention; ``allowed``
    (B|1, 1, T, S) bool. q (B, nh, T, hd), k/v (B, nkv, S, hd) -> (B, nh, T, hd)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5                  # (B, nh, T, S)
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    return F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v


class SelfAttention(nn.Module):
    def __init__(self, config: YxanulConfig):
        super().__init__()
        self.config = config  # read at call time: `attn_implementation` can change after building
        self.n_head, self.n_kv, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.layernorm_qkv = LayerNormQKV(config)
        self.proj = Linear(config.hidden_size, config.hidden_size)

    def forward(self, x, rotary_pos_emb, cache=None, layer_idx: int = 0, attention_mask=None):
        """``attention_mask``: None (causal; the training path) or (B, 1, T, S) bool, True = attend
        (``masking.padding_causal_mask``), then SDPA or eager attention take it as it is."""
        B, T, C = x.shape
        q, k, v = self.layernorm_qkv(x)
        q = apply_rotary(q.view(B, T, self.n_head, self.head_dim), rotary_pos_emb).transpose(1, 2)  # (B, nh, T, hd)
        k = apply_rotary(k.view(B, T, self.n_kv, self.head_dim), rotary_pos_emb).transpose(1, 2)    # (B, nkv, T, hd)
        v = v.view(B, T, self.n_kv, self.head_dim).transpose(1, 2)                                   # (B, nkv, T, hd)
        if cache is not None:  # transformers' Cache: append this step's k/v, get the whole prefix back
            k, v = cache.update(k, v, layer_idx)                                                    # (B, nkv, S, hd)
            S = int(cache.get_seq_length(layer_idx))  # a StaticCache hands back every slot, the filled ones first
            if k.shape[2] != S:
                k, v = k[:, :, :S], v[:, :, :S]
        if attention_mask is not None or self.config._attn_implementation == "eager":
            y = self.masked_attention(q, k, v, attention_mask)
            return self.proj(y.transpose(1, 2).reshape(B, T, C))
        S = k.shape[2]
        # Causal with the queries at the END of the keys: SDPA's is_causal aligns them top-left, which is
        # only right when T == S (no cache, or a prefill); one new token (T == 1) sees every key.
        mask = None if T in (1, S) else torch.ones(T, S, dtype=torch.bool, device=x.device).tril(S - T)
        kw = dict(is_causal=T == S and T > 1, attn_mask=mask)
        if self.n_kv == self.n_head:
            y = F.scaled_dot_product_attention(q, k, v, **kw)
        elif _SDPA_HAS_GQA:
            y = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
        else:  # pragma: no cover - torch < 2.5
            rep = self.n_head // self.n_kv
            y = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), **kw)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))  # (B, nh, T, hd) -> (B, T, C)

    def masked_attention(self, q, k, v, allowed):
        """Attention under an explicit mask (padding, or eager's causal one); rows that see no key (a
        left pad) come out as zeros with SDPA and as a uniform average with eager: finite either way."""
        T, S = q.shape[2], k.shape[2]
        if allowed is None:
            allowed = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)[None, None]
        if self.config._attn_implementation == "eager":
            return eager_attention(q, k, v, allowed)
        if self.n_kv != self.n_head:  # SDPA's enable_gqa is not taken together with a mask by every kernel
            rep = self.n_head // self.n_kv
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


class YxanulDecoderLayer(GradientCheckpointingLayer):
    """Pre-norm block with the children of ``te.TransformerLayer`` (the norms live inside the linears)."""

    def __init__(self, config: YxanulConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.self_attention = SelfAttention(config)
        self.layernorm_mlp = LayerNormMLP(config)

    def forward(self, hidden_states, rotary_pos_emb=None, is_first_microbatch=None, cache=None, attention_mask=None):
        # is_first_microbatch: TE only. `cache`: transformers' Cache (GradientCheckpointingLayer drops it
        # while recomputing in training). `attention_mask`: None or (B, 1, T, S) bool (SelfAttention).
        device = hidden_states.device.type
        if torch.is_autocast_enabled(device):  # as te.TransformerLayer: the residual runs in the autocast dtype
            hidden_states = hidden_states.to(torch.get_autocast_dtype(device))
        x = hidden_states + self.self_attention(hidden_states, rotary_pos_emb, cache, self.layer_idx,
                                                attention_mask)                 # (B, T, C)
        return x + self.layernorm_mlp(x)                                        # (B, T, C)
