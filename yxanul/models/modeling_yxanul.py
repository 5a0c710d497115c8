"""`YxanulForCausalLM`: a Llama-style decoder whose modules are shaped like Transformer Engine's.

The torch backend below produces the same module tree and state-dict names as TE's
``TransformerLayer`` (``self_attention.layernorm_qkv.{layer_norm_weight,query_weight,key_weight,
value_weight}``, ``self_attention.proj.weight``, ``layernorm_mlp.{layer_norm_weight,fc1_weight,
fc2_weight}``), so a checkpoint moves between backends with no renaming. The TE backend lives in
``modeling_te.py``; this file never imports TE.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import CausalLMOutput

from .configuration_yxanul import YxanulConfig


def resolve_backend(requested: str) -> str:
    """'auto' -> 'te' when Transformer Engine imports and a CUDA device is present, else 'torch'."""
    if requested != "auto":
        return requested
    try:
        from .. import _te

        te_ok = bool(_te.TE_AVAILABLE)
    except Exception:
        te_ok = False
    return "te" if te_ok and torch.cuda.is_available() else "torch"


def _drop_extra_state(module, state_dict, prefix, *args):
    """Load hook: TE checkpoints carry ``*_extra_state`` (FP8 scaling state); torch modules ignore it."""
    for key in [k for k in state_dict if k.startswith(prefix) and k.endswith("_extra_state")
                and "." not in k[len(prefix):]]:
        state_dict.pop(key)


class _TEShaped(nn.Module):
    """Base of the torch twins of TE modules: tolerant of TE's ``_extra_state`` keys."""

    def __init__(self):
        super().__init__()
        self._register_load_state_dict_pre_hook(_drop_extra_state, with_module=True)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


class RMSNorm(_TEShaped):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class LayerNormQKV(_TEShaped):
    """Twin of ``te.LayerNormLinear`` with parameters_split q/k/v (RMSNorm, no bias)."""

    def __init__(self, config: YxanulConfig):
        super().__init__()
        h, kv = config.hidden_size, config.num_key_value_heads * config.head_dim
        self.eps = config.rms_norm_eps
        self.layer_norm_weight = nn.Parameter(torch.ones(h))
        self.query_weight = nn.Parameter(torch.empty(h, h))
        self.key_weight = nn.Parameter(torch.empty(kv, h))
        self.value_weight = nn.Parameter(torch.empty(kv, h))

    def forward(self, x):
        x = rms_norm(x, self.layer_norm_weight, self.eps)
        return F.linear(x, self.query_weight), F.linear(x, self.key_weight), F.linear(x, self.value_weight)


class Linear(_TEShaped):
    """Twin of ``te.Linear`` (no bias)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))

    def forward(self, x):
        return F.linear(x, self.weight)


class LayerNormMLP(_TEShaped):
    """Twin of ``te.LayerNormMLP(normalization='RMSNorm', activation='swiglu', bias=False)``:
    fc1_weight = cat([gate, up]) and SiLU applies to the first half."""

    def __init__(self, config: YxanulConfig):
        super().__init__()
        h, f = config.hidden_size, config.intermediate_size
        self.eps = config.rms_norm_eps
        self.layer_norm_weight = nn.Parameter(torch.ones(h))
        self.fc1_weight = nn.Parameter(torch.empty(2 * f, h))
        self.fc2_weight = nn.Parameter(torch.empty(h, f))

    def forward(self, x):
        x = rms_norm(x, self.layer_norm_weight, self.eps)
        gate, up = F.linear(x, self.fc1_weight).chunk(2, dim=-1)  # (B, T, F) each
        return F.linear(F.silu(gate) * up, self.fc2_weight)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """x (B, T, nh, hd), freqs [T, 1, 1, hd] in TE's layout (non-interleaved, like HF Llama)."""
    f = freqs[:, 0, 0, :].unsqueeze(0).unsqueeze(2)  # (1, T, 1, hd)
    xf = x.float()
    return (xf * f.cos() + rotate_half(xf) * f.sin()).to(x.dtype)


class SelfAttention(nn.Module):
    def __init__(self, config: YxanulConfig):
        super().__init__()
        self.n_head, self.n_kv, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.layernorm_qkv = LayerNormQKV(config)
        self.proj = Linear(config.hidden_size, config.hidden_size)

    def forward(self, x, rotary_pos_emb):
        B, T, C = x.shape
        q, k, v = self.layernorm_qkv(x)
        q = apply_rotary(q.view(B, T, self.n_head, self.head_dim), rotary_pos_emb)  # (B, T, nh, hd)
        k = apply_rotary(k.view(B, T, self.n_kv, self.head_dim), rotary_pos_emb)    # (B, T, nkv, hd)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        if self.n_kv != self.n_head:
            rep = self.n_head // self.n_kv
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hd)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class DecoderLayer(GradientCheckpointingLayer):
    """Pre-norm block; same children as ``te.TransformerLayer`` (norms live inside the linears)."""

    def __init__(self, config: YxanulConfig, layer_idx: int):
        super().__init__()
        self.self_attention = SelfAttention(config)
        self.layernorm_mlp = LayerNormMLP(config)

    def forward(self, hidden_states, rotary_pos_emb=None, is_first_microbatch=None):
        x = hidden_states + self.self_attention(hidden_states, rotary_pos_emb)  # (B, T, C)
        return x + self.layernorm_mlp(x)


class RotaryEmbedding(nn.Module):
    """Produces TE's rotary tensor ``[T, 1, 1, head_dim] = cat(f, f)`` for both backends.

    Computed from the config, not stored: no buffer to save, and nothing for from_pretrained's
    meta-device initialisation to leave uninitialised. Cached per (length, device)."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self._cache: dict = {}

    def forward(self, seq_len: int, device=None) -> torch.Tensor:
        key = (seq_len, device)
        if key not in self._cache:
            inv_freq = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device)
                                             / self.head_dim))
            f = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)  # (T, hd/2)
            self._cache = {key: torch.cat((f, f), dim=-1).view(seq_len, 1, 1, -1)}               # [T, 1, 1, hd]
        return self._cache[key]


class YxanulPreTrainedModel(PreTrainedModel):
    config_class = YxanulConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["DecoderLayer", "TEDecoderLayer"]
    _supports_sdpa = True

    def _init_weights(self, module):
        """Explicit init by parameter name. transformers' default matches class names containing
        'LayerNorm' and would fill TE's LayerNormLinear QKV matrix with ones."""
        std = self.config.initializer_range
        out_std = std / math.sqrt(2 * self.config.num_hidden_layers)  # GPT-2 residual scaling
        output_proj = getattr(module, "_yx_output_proj", False)
        for name, p in module.named_parameters(recurse=False):
            if p.dim() == 1:                                   # RMSNorm weights
                nn.init.ones_(p)
            elif name == "fc2_weight" or output_proj:          # layers writing into the residual
                nn.init.normal_(p, 0.0, out_std)
            else:                                              # q/k/v, fc1, embeddings, LM head
                nn.init.normal_(p, 0.0, std)


class YxanulModel(YxanulPreTrainedModel):
    def __init__(self, config: YxanulConfig):
        super().__init__(config)
        config.backend = resolve_backend(config.backend)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        if config.backend == "te":
            from .modeling_te import TEDecoderLayer, te_rmsnorm

            self.layers = nn.ModuleList(TEDecoderLayer(config, i) for i in range(config.num_hidden_layers))
            self.norm = te_rmsnorm(config.hidden_size, config.rms_norm_eps)
        else:
            self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
            self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        for layer in self.layers:
            layer.self_attention.proj._yx_output_proj = True
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta)
        self.gradient_checkpointing = False
        self.post_init()

    def forward(self, input_ids, is_first_microbatch=None):
        x = self.embed_tokens(input_ids)                     # (B, T, C)
        freqs = self.rotary_emb(input_ids.shape[1], x.device)  # [T, 1, 1, hd]
        for layer in self.layers:
            x = layer(x, freqs, is_first_microbatch=is_first_microbatch)
        return self.norm(x)


class LMHead(nn.Module):
    """The output projection. Deliberately not an ``nn.Linear``: accelerate's FP8 ``convert_model``
    swaps every ``nn.Linear`` for ``te.Linear``, which breaks the tie with the embedding and drops
    the new weight from the optimizer (see docs/fp8.md). The LM head stays BF16 and trainable."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))

    def forward(self, x):
        return F.linear(x, self.weight)


class YxanulForCausalLM(YxanulPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: YxanulConfig):
        super().__init__(config)
        self.model = YxanulModel(config)
        self.lm_head = LMHead(config.hidden_size, config.vocab_size)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(self, input_ids, labels=None, shift_labels=None, is_first_microbatch=None,
                attention_mask=None, **kwargs) -> CausalLMOutput:
        """Causal LM. ``labels``: HF-style (shifted here); ``shift_labels``: already aligned targets.
        ``attention_mask`` is accepted for generate() and ignored: sequences are causal, unpadded."""
        h = self.model(input_ids, is_first_microbatch=is_first_microbatch)  # (B, T, C)
        logits = self.lm_head(h)                                             # (B, T, V)
        loss = None
        if labels is not None and shift_labels is None:
            shift_labels = F.pad(labels[:, 1:], (0, 1), value=-100)
        if shift_labels is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), shift_labels.reshape(-1),
                                   ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        # No KV cache: always feed the whole sequence (HF would otherwise feed only the last token).
        return {"input_ids": input_ids[:, -self.config.max_position_embeddings:]}

    def _supports_default_dynamic_cache(self) -> bool:  # transformers: don't build a cache for us
        return False

    def generate(self, *args, **kwargs):
        kwargs["use_cache"] = False
        return super().generate(*args, **kwargs)
