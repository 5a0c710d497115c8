"""Any MODEL argument (run, checkpoint, native or Llama export) as a transformers causal LM in memory,
for the tools that drive a model through the transformers interface (lm-eval's HFLM, TRL's trainers).

A yxanul model becomes the ``LlamaForCausalLM`` with the same weights (the exact name mapping of
``yxanul export``: :func:`yxanul.models.state_dict.yxanul_to_llama`), so no export step is needed and nothing is
written to disk. The commands built on this (``yxanul eval --tasks hellaswag,...``, ``yxanul grpo``) take
any ``PreTrainedModel`` with a tokenizer, so a native ``YxanulForCausalLM`` with the transformers
forward interface can be handed to them as it is.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import UserError
from ..hub.export import llama_config
from ..hub.loading import load_model
from ..models.state_dict import yxanul_to_llama


def as_llama(model):
    """A ``YxanulForCausalLM`` -> the ``LlamaForCausalLM`` with the same weights, dtype and device (eval
    mode); any other model is returned as it is."""
    if getattr(model.config, "model_type", None) != "yxanul":
        return model
    from transformers import LlamaForCausalLM

    p = next(model.parameters())
    cfg = llama_config(model.config, p.dtype)
    state = yxanul_to_llama(model.state_dict(), cfg.tie_word_embeddings)
    llama = LlamaForCausalLM(cfg).to(dtype=p.dtype)
    missing, unexpected = llama.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and cfg.tie_word_embeddings)]
    if missing or unexpected:  # the mapping is total: anything left over is a bug, not a user mistake
        raise RuntimeError(f"Llama conversion: missing {missing[:3]}, unexpected {unexpected[:3]}")
    llama.tie_weights()
    return llama.to(p.device).eval()


def with_pad_token(tokenizer):
    """Batched scoring and generation pad; a tokenizer without a pad token pads with its end-of-text
    (the usual choice for GPT-2-style vocabularies: padded positions are masked out)."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None):
    """(transformers causal LM in eval mode on ``device``, tokenizer with a pad token) for a MODEL argument."""
    model, tok = load_model(path, device, dtype)
    if tok is None:
        raise UserError(f"MODEL '{path}': no tokenizer found (a run needs its prepared data folder; an export "
                        "needs its tokenizer files)")
    return as_llama(model), with_pad_token(tok)
