"""Transformer Engine backend of the decoder block. TE comes only through `yxanul._te`.

`TEDecoderLayer` IS a `te.TransformerLayer` (a subclass, no wrapper level), so its state-dict names
are TE's own, and equal the torch twin's (read in TE 2.20's sources):

- `transformer.py` `TransformerLayer.__init__`: children `self_attention` (MultiheadAttention) and
  `layernorm_mlp` (LayerNormMLP); `inter_attention` only for layer_type="decoder", `layernorm`
  only for output_layernorm=True (neither used here).
- `attention/multi_head_attention.py`: `layernorm_qkv = LayerNormLinear(...,
  parameters_split={"query", "key", "value"})` when fuse_qkv_params=False, whose parameters are
  `layer_norm_weight`, `query_weight`, `key_weight`, `value_weight` (`layernorm_linear.py`:
  f"{name.rstrip('_')}_weight"). With `fuse_qkv_params` (config key, default off) it holds one
  `weight` = cat[q, k, v] (`qkv_weight_interleaved=False`: TE splits it as [(np/ng + 2), ng, hn]), or with
  `fuse_qkv_rope` grouped per KV head (`qkv_weight_interleaved=True`: [ng, (np/ng + 2), hn], the layout TE's
  fused QKV RoPE kernel reads); state-dict hooks save/load it as q/k/v so checkpoints keep the same names;
  `proj = Linear(...)` -> `proj.weight`;
  `core_attention` (DotProductAttention) has no parameters, only `_extra_state`.
- `module/layernorm_mlp.py`: `layer_norm_weight`, `fc1_weight` (2*ffn x hidden for SwiGLU, gate
  first), `fc2_weight`.

Settings that differ from TE's defaults and matter: dropout 0 (TE: 0.1), bias=False, RMSNorm,
SwiGLU, causal, batch-first ("bshd"; TE: "sbhd"), fp32 master weights, and the init: TE's default
is N(0, 0.023) for every GEMM weight; we pass N(0, initializer_range) and, for the two layers that
write into the residual stream (proj, fc2), N(0, initializer_range / sqrt(2 * num_layers)) — the
same rule `YxanulPreTrainedModel._init_weights` applies by parameter name, so both backends
initialize identically whichever runs last. `layer_number` only matters with
NVTE_APPLY_QK_LAYER_SCALING=1 (unfused attention), which yxanul never sets.

Every TE module here saves an EMPTY `_extra_state`: TE would pickle delayed-scaling state there,
and loading a pickle needs NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1. The FP8 scaling state travels in
`fp8_state.safetensors` instead (`yxanul.precision.state`, docs/fp8.md).
"""

from __future__ import annotations

import functools
import math

import torch

from .. import _te
from .._te import TE_AVAILABLE, TE_IMPORT_ERROR, te
from ..errors import ConfigError
from ..precision.state import no_pickled_extra_state
from .state_dict import fuse_split_qkv, split_fused_qkv

if not TE_AVAILABLE:  # pragma: no cover - the caller turns this into a one-line ConfigError
    raise ImportError(f"backend 'te' needs Transformer Engine: {TE_IMPORT_ERROR}")


def _device() -> str:
    """Where TE allocates parameters: "meta" under `with torch.device("meta")`, else CUDA
    (TE's base module raises "TransformerEngine needs CUDA" without a GPU anyway)."""
    default = torch.get_default_device() if hasattr(torch, "get_default_device") else torch.device("cpu")
    return "meta" if default.type == "meta" else "cuda"


def _params_dtype() -> torch.dtype:
    """The dtype the torch twin's parameters get: torch's default (fp32 in `yxanul train`; BF16 under
    ``from_pretrained(..., dtype=torch.bfloat16)``, which sets the default while the model is built). Not a
    fixed fp32: the embedding follows the default, and a TE tree in fp32 beside a BF16 embedding breaks
    every forward run outside autocast (generation on the torch twin, GRPO rollouts)."""
    return torch.get_default_dtype()


def init_methods(config):
    """(init_method, output_layer_init_method) matching `_init_weights` of the torch backend."""
    std = config.initializer_range
    out_std = std / math.sqrt(2 * config.num_hidden_layers)

    def normal(tensor, _std=std):
        return torch.nn.init.normal_(tensor, mean=0.0, std=_std)

    def normal_out(tensor, _std=out_std):
        return torch.nn.init.normal_(tensor, mean=0.0, std=_std)

    return normal, normal_out


class TEDecoderLayer(te.TransformerLayer):  # pragma: no cover - GPU only
    def __init__(self, config, layer_idx: int):
        if config.fuse_qkv_rope and _te.fused_qkv_rope is None:
            raise ConfigError("fuse_qkv_rope", f"false with Transformer Engine {_te.te_version} (it has no "
                                               "apply_fused_qkv_rotary_pos_emb)", True)
        init_method, output_layer_init_method = init_methods(config)
        _te.use_norm_kernel(config.norm_kernel)
        self.rope_kernel = _rope_kernel(config)
        fused = config.fuse_qkv_params or config.fuse_qkv_rope
        super().__init__(
            hidden_size=config.hidden_size, ffn_hidden_size=config.intermediate_size,
            num_attention_heads=config.num_attention_heads, num_gqa_groups=config.num_key_value_heads,
            kv_channels=config.head_dim, layernorm_epsilon=config.rms_norm_eps,
            hidden_dropout=0.0, attention_dropout=0.0,
            init_method=init_method, output_layer_init_method=output_layer_init_method,
            layer_number=layer_idx + 1, self_attn_mask_type="causal", normalization="RMSNorm",
            activation="swiglu", bias=False, attn_input_format="bshd",
            # fused rows: cat[q, k, v]; for the fused RoPE kernel, grouped per KV head [ng, (g + 2), hd]
            fuse_qkv_params=fused, qkv_weight_interleaved=config.fuse_qkv_rope,
            params_dtype=_params_dtype(), device=_device(),
        )
        self.layer_idx = layer_idx
        no_pickled_extra_state(self)
        ng, hd = config.num_key_value_heads, config.head_dim
        g = config.num_attention_heads // ng                 # query heads per KV head
        self.rope_split = [g * hd, hd, hd] if config.fuse_qkv_rope else None  # one KV group's q | k | v columns
        if fused:  # one QKV parameter (one weight cast/quantize per step); names unchanged
            groups = (ng, g, hd) if config.fuse_qkv_rope else None
            qkv = self.self_attention.layernorm_qkv
            # an FP8 weight (FSDP2 shards of it) is saved fused: the checkpoint readers split it
            if not qkv.primary_weights_in_fp8:
                qkv.register_state_dict_post_hook(split_fused_qkv((config.hidden_size, ng * hd, ng * hd), groups))
            qkv.register_load_state_dict_pre_hook(functools.partial(fuse_split_qkv, groups=groups))

    def forward(self, hidden_states, rotary_pos_emb=None, is_first_microbatch=None, attention_mask=None):
        """(B, T, C) -> (B, T, C); ``rotary_pos_emb`` [T, 1, 1, head_dim] (non-interleaved). ``attention_mask``:
        None (causal, the training path) or yxanul's (B, 1, T, S) bool, True = attend; TE's convention is
        the opposite (True = masked out). It goes in as TE's "arbitrary" mask: "padding_causal" turns the
        mask into sequence lengths, i.e. assumes right padding, and generation pads on the left."""
        if attention_mask is None and self.rope_split is not None and rotary_pos_emb is not None:
            return self._fused_rope_forward(hidden_states, rotary_pos_emb, is_first_microbatch)
        if attention_mask is None:
            return super().forward(hidden_states, rotary_pos_emb=rotary_pos_emb,
                                   is_first_microbatch=is_first_microbatch)
        return super().forward(hidden_states, attention_mask=~attention_mask, self_attn_mask_type="arbitrary",
                               rotary_pos_emb=rotary_pos_emb, is_first_microbatch=is_first_microbatch)

    def _fused_rope_forward(self, x, freqs, is_first_microbatch):
        """``fuse_qkv_rope``: TransformerLayer.forward's causal path for these settings (pre-norm, no bias, no
        dropout: x + attn(x), then + mlp) through the same child modules, with q/k RoPE and the q/k/v split done
        by ONE TE kernel on the packed projection (and one in backward). TE's MultiheadAttention instead splits
        the projection into strided views and rotates q and k in two launches each way (TE 2.20
        multi_head_attention.py: it never calls the fused QKV kernel)."""
        attn = self.self_attention
        if torch.is_autocast_enabled("cuda"):  # as TransformerLayer.forward: the residual stream in autocast's dtype
            x = x.to(torch.get_autocast_dtype("cuda"))
        B, T, _ = x.shape
        qkv = attn.layernorm_qkv(x, is_first_microbatch=is_first_microbatch)     # (B, T, ng * (g + 2) * hd)
        qkv = qkv.view(B, T, -1, sum(self.rope_split))                          # (B, T, ng, (g + 2) * hd)
        if self.rope_kernel is None:
            q, k, v = _te.fused_qkv_rope(qkv, freqs, freqs, self.rope_split, tensor_format="bshd")  # contiguous
            q, k, v = (t.view(B, T, -1, self.rope_split[-1]) for t in (q, k, v))  # (B, T, nh, hd), (B, T, ng, hd) x 2
        else:  # rope_kernel triton: the same three tensors, already in that shape
            q, k, v = self.rope_kernel(qkv, freqs, self.rope_split[0] // self.rope_split[-1])
        ctx = attn.core_attention(q, k, v, qkv_format="bshd", attn_mask_type="causal")  # (B, T, nh * hd)
        out = attn.proj(ctx, is_first_microbatch=is_first_microbatch)
        x = x + (out[0] if attn.return_bias else out)                           # the bias: empty (bias=False)
        mlp = self.layernorm_mlp(x, is_first_microbatch=is_first_microbatch)
        return x + (mlp[0] if self.layernorm_mlp.return_bias else mlp)


def _rope_kernel(config):
    """``fuse_qkv_rope``'s kernel when it is not TE's (``rope_kernel: triton``), else None (ModelArgs refuses
    the choice without ``fuse_qkv_rope``; a config that has it anyway never calls the kernel)."""
    if config.rope_kernel == "te" or not config.fuse_qkv_rope:
        return None
    try:
        from .rope_triton import fused_qkv_rope  # triton: CUDA builds of torch only, and only this choice needs it
    except ImportError as e:
        raise ConfigError("rope_kernel", f"te: triton does not import here ({e})", config.rope_kernel) from None
    return fused_qkv_rope


def te_rmsnorm(hidden_size: int, eps: float):  # pragma: no cover - GPU only
    """The final norm (`te.RMSNorm`, parameter `weight`, fp32)."""
    norm = te.RMSNorm(hidden_size, eps=eps, dtype=_params_dtype(), device=_device())
    no_pickled_extra_state(norm)
    return norm


def checkpointed_forward(layer, hidden_states, rotary_pos_emb, is_first_microbatch,
                         attention_mask=None):  # pragma: no cover
    """Activation checkpointing of a TE block with TE's own `checkpoint` (non-reentrant), not
    `torch.utils.checkpoint`: the recompute runs in backward, outside the step's `te.autocast`, and
    torch's version would recompute in BF16 what the forward did in FP8 (different saved tensors).
    TE's captures the autocast state and recipe of the forward and re-enters them for the recompute,
    which also reuses the forward's delayed-scaling scales (TE 2.20 `distributed.py` `checkpoint`)."""
    return te.checkpoint(layer, hidden_states, rotary_pos_emb, is_first_microbatch, attention_mask, use_reentrant=False)
