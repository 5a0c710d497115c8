"""Transformer Engine backend of the decoder block. TE comes only through `yxanul._te`.

`te.TransformerLayer` with RMSNorm, SwiGLU, GQA, no bias, dropout 0 (TE defaults to 0.1!),
causal mask, batch-first ("bshd"); its children are `self_attention.{layernorm_qkv,core_attention,
proj}` and `layernorm_mlp`, i.e. exactly the state-dict names of the torch twin. Weights are
initialised by `YxanulPreTrainedModel._init_weights` (by name), the same as the torch backend.
"""

from __future__ import annotations

import torch

from .._te import TE_AVAILABLE, TE_IMPORT_ERROR, te

if not TE_AVAILABLE:  # pragma: no cover
    raise ImportError(f"backend 'te' needs Transformer Engine: {TE_IMPORT_ERROR}")


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


class TEDecoderLayer(te.TransformerLayer):  # pragma: no cover - GPU only
    def __init__(self, config, layer_idx: int):
        super().__init__(
            hidden_size=config.hidden_size, ffn_hidden_size=config.intermediate_size,
            num_attention_heads=config.num_attention_heads, num_gqa_groups=config.num_key_value_heads,
            layernorm_epsilon=config.rms_norm_eps, hidden_dropout=0.0, attention_dropout=0.0,
            layer_number=layer_idx + 1, self_attn_mask_type="causal", normalization="RMSNorm",
            activation="swiglu", bias=False, attn_input_format="bshd", fuse_qkv_params=False,
            params_dtype=torch.float32, device=_device(),
        )

    def forward(self, hidden_states, rotary_pos_emb=None, is_first_microbatch=None):
        return super().forward(hidden_states, rotary_pos_emb=rotary_pos_emb, is_first_microbatch=is_first_microbatch)


def te_rmsnorm(hidden_size: int, eps: float):  # pragma: no cover - GPU only
    return te.RMSNorm(hidden_size, eps=eps, device=_device())
