"""yxanul's state-dict names and Llama's, both ways: ``yxanul_to_llama`` for `yxanul export --format
llama` and the in-process Llama view, ``llama_to_yxanul`` for ``--init_from`` on a Llama export; the
load/save hooks that keep one set of names across backends (TE ``*_extra_state``, fused QKV).

Name mapping (yxanul/TE -> Llama), per layer i (docs/export.md has the table):
  self_attention.layernorm_qkv.layer_norm_weight -> input_layernorm.weight   (RMSNorm folded into TE's LayerNormLinear)
  self_attention.layernorm_qkv.{query,key,value}_weight -> self_attn.{q,k,v}_proj.weight
  self_attention.proj.weight -> self_attn.o_proj.weight
  layernorm_mlp.layer_norm_weight -> post_attention_layernorm.weight          (folded into TE's LayerNormMLP)
  layernorm_mlp.fc1_weight = cat[gate, up] -> mlp.gate_proj.weight, mlp.up_proj.weight
  layernorm_mlp.fc2_weight -> mlp.down_proj.weight
RoPE needs no permutation: yxanul (like te.RotaryPositionEmbedding) rotates non-interleaved halves
(rotate_half) with inv_freq = theta^(-2i/d), exactly HF Llama's convention.
"""

from __future__ import annotations

import re

import torch

from ..errors import UserError

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# yxanul per-layer suffix -> Llama per-layer suffix (fc1 is split in two: handled apart)
_TO_LLAMA = {
    "self_attention.layernorm_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.layernorm_qkv.query_weight": "self_attn.q_proj.weight",
    "self_attention.layernorm_qkv.key_weight": "self_attn.k_proj.weight",
    "self_attention.layernorm_qkv.value_weight": "self_attn.v_proj.weight",
    "self_attention.proj.weight": "self_attn.o_proj.weight",
    "layernorm_mlp.layer_norm_weight": "post_attention_layernorm.weight",
    "layernorm_mlp.fc2_weight": "mlp.down_proj.weight",
}
_FROM_LLAMA = {v: k for k, v in _TO_LLAMA.items()}
_GLOBAL = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")
# the per-layer weights that are TE GEMM weights (FP8 weights under fp8_weight_all_gather), fused QKV or split
TE_GEMM_WEIGHTS = ("self_attention.layernorm_qkv.weight", "self_attention.layernorm_qkv.query_weight",
                   "self_attention.layernorm_qkv.key_weight", "self_attention.layernorm_qkv.value_weight",
                   "self_attention.proj.weight", "layernorm_mlp.fc1_weight", "layernorm_mlp.fc2_weight")


def is_te_gemm_weight(name: str) -> bool:
    m = _LAYER.match(name)
    return bool(m) and m.group(2) in TE_GEMM_WEIGHTS


def yxanul_to_llama(state: dict[str, torch.Tensor], tie_word_embeddings: bool) -> dict[str, torch.Tensor]:
    """yxanul/TE state dict -> LlamaForCausalLM state dict (contiguous copies; no tied head when tied)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if name.endswith("_extra_state") or (name == "lm_head.weight" and tie_word_embeddings):
            continue
        m = _LAYER.match(name)
        if name in _GLOBAL:
            out[name] = t
        elif m and m.group(2) == "layernorm_mlp.fc1_weight":
            gate, up = t.chunk(2, dim=0)                       # (2F, C) -> (F, C), (F, C); SiLU on the gate half
            out[f"model.layers.{m.group(1)}.mlp.gate_proj.weight"] = gate
            out[f"model.layers.{m.group(1)}.mlp.up_proj.weight"] = up
        elif m and m.group(2) in _TO_LLAMA:
            out[f"model.layers.{m.group(1)}.{_TO_LLAMA[m.group(2)]}"] = t
        else:
            raise UserError(f"export: unexpected weight '{name}' (not a yxanul model?)")
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def is_llama_state(state: dict) -> bool:
    return any(".self_attn.q_proj." in k for k in state)


def llama_to_yxanul(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """LlamaForCausalLM state dict -> yxanul names (gate|up concatenated into fc1): the way back for
    ``--init_from`` on a Llama export."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        m = _LAYER.match(name)
        if name in _GLOBAL:
            out[name] = t
        elif m and m.group(2) == "mlp.gate_proj.weight":
            up = state[f"model.layers.{m.group(1)}.mlp.up_proj.weight"]
            out[f"model.layers.{m.group(1)}.layernorm_mlp.fc1_weight"] = torch.cat([t, up])  # (2F, C)
        elif m and m.group(2) == "mlp.up_proj.weight":
            continue
        elif m and m.group(2) in _FROM_LLAMA:
            out[f"model.layers.{m.group(1)}.{_FROM_LLAMA[m.group(2)]}"] = t
        elif not name.endswith("rotary_emb.inv_freq"):
            raise UserError(f"init_from: unexpected Llama weight '{name}'")
    return out


def drop_extra_state(module, state_dict, prefix, *args):
    """Load pre-hook of the torch backend: TE checkpoints carry ``*_extra_state`` (FP8 scaling state,
    also under modules the torch twin lacks, e.g. ``core_attention``); drop them."""
    for key in [k for k in state_dict if k.startswith(prefix) and k.endswith("_extra_state")]:
        del state_dict[key]


def forgive_missing_extra_state(module, incompatible_keys):
    """Load post-hook: a TE model loading a torch-backend checkpoint keeps its fresh FP8 state."""
    missing = incompatible_keys.missing_keys
    missing[:] = [k for k in missing if not k.endswith("_extra_state")]


def grouped_to_qkv(fused: torch.Tensor, groups: tuple[int, int, int]) -> list[torch.Tensor]:
    """``fuse_qkv_rope``'s fused QKV rows, grouped per KV head as TE's ``qkv_weight_interleaved=True`` lays them
    out ([ng, (g + 2), hd]: the g query heads of group j, then its key, then its value), -> [q, k, v] in the
    contract's order (query head j*g + i is row block (j, i), as in HF's ``repeat_kv``). ``groups``: (ng, g, hd)."""
    ng, g, hd = groups
    rows = fused.reshape(ng, g + 2, hd, -1)                                    # (ng, g + 2, hd, C)
    return [rows[:, :g].reshape(ng * g * hd, -1), rows[:, g].reshape(ng * hd, -1), rows[:, g + 1].reshape(ng * hd, -1)]


def qkv_to_grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: tuple[int, int, int]) -> torch.Tensor:
    """The inverse of `grouped_to_qkv`: (h_q, C), (h_kv, C), (h_kv, C) -> (h_q + 2 h_kv, C) grouped rows."""
    ng, g, hd = groups
    parts = (q.reshape(ng, g, hd, -1), k.reshape(ng, 1, hd, -1), v.reshape(ng, 1, hd, -1))
    return torch.cat(parts, dim=1).reshape(ng * (g + 2) * hd, -1)


def split_fused_qkv(sizes: tuple[int, int, int], groups: tuple[int, int, int] | None = None):
    """``fuse_qkv_params``: TE's ``LayerNormLinear`` then holds ONE ``weight`` whose rows are cat[q, k, v]
    (``qkv_weight_interleaved=False``), or with ``groups`` (``fuse_qkv_rope``) the grouped rows of
    `grouped_to_qkv`. State-dict post-hook: save it under the contract's names
    ``query_weight``/``key_weight``/``value_weight`` (cat: views, which checkpoint/io.py gives own storage).
    An FSDP2-sharded weight (a DTensor) stays fused: torch.distributed.checkpoint resolves every state-dict
    key to a module attribute (``_get_fqns``), which the split names are not; the checkpoint readers split
    it (`split_qkv_state`; cat rows only: ``fuse_qkv_rope`` is refused under FSDP2 and DeepSpeed)."""
    def hook(module, state_dict, prefix, local_metadata):
        from torch.distributed.tensor import DTensor

        if isinstance(state_dict.get(prefix + "weight"), DTensor):
            return
        fused = state_dict.pop(prefix + "weight")                       # (h_q + 2 h_kv, C)
        parts = grouped_to_qkv(fused, groups) if groups else fused.split(list(sizes))
        for name, part in zip(("query", "key", "value"), parts):
            state_dict[f"{prefix}{name}_weight"] = part
    return hook


def fuse_split_qkv(module, state_dict, prefix, *args, groups: tuple[int, int, int] | None = None):
    """Load pre-hook of a fused QKV module: a checkpoint's q/k/v weights -> the fused ``weight`` (cat rows, or
    grouped with ``groups``: bind it with functools.partial)."""
    names = [f"{prefix}{n}_weight" for n in ("query", "key", "value")]
    if all(n in state_dict for n in names):
        q, k, v = (state_dict.pop(n) for n in names)
        state_dict[prefix + "weight"] = qkv_to_grouped(q, k, v, groups) if groups else torch.cat([q, k, v])


def fused_qkv_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict under the names of a model holding one fused QKV ``weight`` per layer: every q/k/v
    triple concatenated (what `fuse_split_qkv` does inside ``load_state_dict``; checkpoint/io.py splits)."""
    out = dict(state)
    for key in [k for k in state if k.endswith(".self_attention.layernorm_qkv.query_weight")]:
        fuse_split_qkv(None, out, key.removesuffix("query_weight"))
    return out


_FUSED_QKV = ".self_attention.layernorm_qkv.weight"


def split_qkv_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of `fused_qkv_state`, for the checkpoint readers: each fused QKV weight that a save kept
    whole (FSDP2: `split_fused_qkv`; DeepSpeed's parameter-name based gathers, which no state-dict hook
    sees) under the q/k/v names every reader expects. The q rows are the input width of the layer's output
    projection, k and v the halves of the rest. A state without fused weights comes back unchanged."""
    out = dict(state)
    for key in [k for k in state if k.endswith(_FUSED_QKV)]:
        fused = out.pop(key)                                                       # (h_q + 2 h_kv, C)
        h_q = state[key.removesuffix(_FUSED_QKV) + ".self_attention.proj.weight"].shape[1]
        kv = (fused.shape[0] - h_q) // 2
        for name, part in zip(("query", "key", "value"), fused.split([h_q, kv, kv])):
            out[key.removesuffix("weight") + f"{name}_weight"] = part
    return out
