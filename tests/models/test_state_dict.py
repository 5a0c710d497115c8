"""The fused QKV layouts of `yxanul.models.state_dict` (pure torch): what the save/load hooks of a TE model with
one QKV weight turn into the contract's q/k/v names, and back."""

import functools

import pytest
import torch

from yxanul.models.state_dict import fuse_split_qkv, grouped_to_qkv, qkv_to_grouped, split_fused_qkv


def _qkv(nh: int, ng: int, hd: int, C: int = 6):
    """q, k, v whose every row says which head and row it is: (head * 100 + row) + 0.5 for k, + 0.25 for v."""
    def rows(n, extra):
        return (torch.arange(n * hd, dtype=torch.float32) // hd * 100 + torch.arange(n * hd) % hd + extra)[:, None]
    return rows(nh, 0).repeat(1, C), rows(ng, 0.5).repeat(1, C), rows(ng, 0.25).repeat(1, C)


@pytest.mark.parametrize("nh,ng", [(4, 4), (4, 2), (6, 1)])  # MHA, GQA, MQA
def test_grouped_rows_hold_each_kv_group_with_its_query_heads(nh, ng):
    """TE's qkv_weight_interleaved=True layout, [ng, (g + 2), hd] (multi_head_attention.py), which its fused QKV
    RoPE kernel reads: group j = query heads j*g .. j*g + g - 1, then key head j, then value head j."""
    hd, g = 3, nh // ng
    q, k, v = _qkv(nh, ng, hd)
    fused = qkv_to_grouped(q, k, v, (ng, g, hd))
    assert fused.shape == (q.shape[0] + 2 * k.shape[0], q.shape[1])
    blocks = fused.view(ng, g + 2, hd, -1)
    for j in range(ng):
        for i in range(g):
            assert torch.equal(blocks[j, i], q.view(nh, hd, -1)[j * g + i])
        assert torch.equal(blocks[j, g], k.view(ng, hd, -1)[j]) and torch.equal(blocks[j, g + 1], v.view(ng, hd, -1)[j])
    back = grouped_to_qkv(fused, (ng, g, hd))
    assert all(torch.equal(a, b) for a, b in zip(back, (q, k, v)))


@pytest.mark.parametrize("groups", [None, (2, 2, 3)])
def test_the_hooks_save_q_k_v_names_and_load_them_back_in_either_layout(groups):
    """The post-hook a TE model with one fused QKV weight registers, and its load pre-hook: the saved names are the
    contract's, their values the unfused weights, whatever the layout; loading them rebuilds the same rows."""
    q, k, v = _qkv(4, 2, 3)
    module = torch.nn.Module()
    fused = qkv_to_grouped(q, k, v, groups) if groups else torch.cat([q, k, v])
    module.weight = torch.nn.Parameter(fused.clone())
    module.register_state_dict_post_hook(split_fused_qkv((12, 6, 6), groups))
    module.register_load_state_dict_pre_hook(functools.partial(fuse_split_qkv, groups=groups))
    state = {k: v.clone() for k, v in module.state_dict().items()}  # cat rows: views of the weight (io.py copies)
    assert sorted(state) == ["key_weight", "query_weight", "value_weight"]
    assert torch.equal(state["query_weight"], q) and torch.equal(state["key_weight"], k)
    assert torch.equal(state["value_weight"], v)
    with torch.no_grad():
        module.weight.zero_()
    module.load_state_dict(state)
    assert torch.equal(module.weight, fused)


@pytest.mark.parametrize("tied", [True, False])
def test_the_llama_mapping_goes_there_and_back_to_the_same_tensors(tiny_config, tied):
    """yxanul -> Llama (gate and up split out of fc1, the tied head left out) -> yxanul: every tensor back under its
    own name, fc1 as cat[gate, up] again (the fast check beside the slow export round trip)."""
    from yxanul.models import YxanulForCausalLM
    from yxanul.models.state_dict import llama_to_yxanul, yxanul_to_llama

    torch.manual_seed(0)
    state = YxanulForCausalLM(tiny_config(tie_word_embeddings=tied)).state_dict()
    llama = yxanul_to_llama(state, tied)
    assert ("lm_head.weight" in llama) is not tied
    gate, up = llama["model.layers.0.mlp.gate_proj.weight"], llama["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(torch.cat([gate, up]), state["model.layers.0.layernorm_mlp.fc1_weight"])
    back = llama_to_yxanul(llama)
    expected = {k: v for k, v in state.items() if not (tied and k == "lm_head.weight")}
    assert back.keys() == expected.keys() and all(torch.equal(back[k], expected[k]) for k in expected)
