"""The model on its real code paths: shapes, names, init, presets, generate, golden reference."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from yxanul.models import PRESETS, YxanulForCausalLM, config_from_preset, count_parameters
from yxanul.models.configuration_yxanul import YxanulConfig
from yxanul.errors import ConfigError


def tiny(**kw):
    return config_from_preset("tiny", 1000, 64, **kw)  # vocab padded to 1024


def test_forward_backward_and_initial_loss():
    torch.manual_seed(0)
    model = YxanulForCausalLM(tiny())
    assert model.config.vocab_size == 1024
    x = torch.randint(0, 1000, (2, 32))
    out = model(x, labels=x)
    assert out.logits.shape == (2, 32, 1024)
    assert abs(out.loss.item() - math.log(1024)) < 0.3      # small init: near-uniform predictions
    out.loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_shift_labels_equals_hf_labels():
    model = YxanulForCausalLM(tiny())
    x = torch.randint(0, 1000, (2, 17))
    a = model(x[:, :-1], shift_labels=x[:, 1:]).loss
    b = model(x[:, :-1], labels=x[:, :-1]).loss  # HF-style: last position has no target
    c = model(x, labels=x).loss
    assert torch.allclose(a, c, atol=1e-6) or abs(a - c) < 0.05
    assert torch.isfinite(b)


def test_state_dict_names_are_te_shaped():
    keys = set(YxanulForCausalLM(tiny()).state_dict())
    p = "model.layers.0."
    for k in ["self_attention.layernorm_qkv.layer_norm_weight", "self_attention.layernorm_qkv.query_weight",
              "self_attention.layernorm_qkv.key_weight", "self_attention.layernorm_qkv.value_weight",
              "self_attention.proj.weight", "layernorm_mlp.layer_norm_weight", "layernorm_mlp.fc1_weight",
              "layernorm_mlp.fc2_weight"]:
        assert p + k in keys
    assert {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} <= keys
    assert not any("inv_freq" in k for k in keys)


def test_init_does_not_fill_qkv_with_ones():
    m = YxanulForCausalLM(tiny())
    q = m.model.layers[0].self_attention.layernorm_qkv.query_weight
    assert 0.015 < q.std().item() < 0.025 and not torch.all(q == 1)
    assert torch.all(m.model.layers[0].self_attention.layernorm_qkv.layer_norm_weight == 1)
    out_std = 0.02 / math.sqrt(2 * m.config.num_hidden_layers)
    assert abs(m.model.layers[0].layernorm_mlp.fc2_weight.std().item() - out_std) < 0.3 * out_std


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_parameter_counts(name):
    cfg = config_from_preset(name, 50257, 2048)
    with torch.device("meta"):
        model = YxanulForCausalLM(cfg)
    assert count_parameters(cfg) == sum(p.numel() for p in model.parameters())


def test_seed_sizes():
    n = {k: count_parameters(config_from_preset(k, 50257, 2048)) / 1e6 for k in PRESETS}
    assert 170 < n["small"] < 190 and 360 < n["medium"] < 390 and 740 < n["large"] < 780
    assert 1400 < n["xlarge"] < 1500 and 115 < n["gpt2-124m"] < 130
    assert PRESETS["xlarge"]["num_hidden_layers"] == 32 and PRESETS["xlarge"]["hidden_size"] == 1920


def test_bad_shapes_are_config_errors():
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        YxanulConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=3)
    with pytest.raises(ConfigError, match="model"):
        config_from_preset("huge", 100, 10)


def test_generate_matches_manual_greedy_loop():
    torch.manual_seed(0)
    model = YxanulForCausalLM(tiny()).eval()
    x = torch.randint(0, 1000, (1, 5))
    out = model.generate(x, max_new_tokens=6, do_sample=False, pad_token_id=0)
    seq = x
    for _ in range(6):
        nxt = model(seq).logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
    assert torch.equal(out, seq)


def test_gradient_checkpointing_same_grads():
    torch.manual_seed(0)
    a = YxanulForCausalLM(tiny())
    b = YxanulForCausalLM(tiny())
    b.load_state_dict(a.state_dict())
    b.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    a.train(), b.train()
    x = torch.randint(0, 1000, (2, 16))
    a(x, labels=x).loss.backward()
    b(x, labels=x).loss.backward()
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-6), n


def test_save_load_roundtrip_and_auto_class(tmp_path):
    m = YxanulForCausalLM(tiny())
    m.save_pretrained(tmp_path)
    r = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert isinstance(r, YxanulForCausalLM) and r.lm_head.weight is r.model.embed_tokens.weight
    x = torch.randint(0, 1000, (1, 8))
    assert torch.allclose(m(x).logits, r(x).logits)


def test_loads_state_dict_with_te_extra_state():
    m = YxanulForCausalLM(tiny())
    sd = m.state_dict()
    sd["model.layers.0.self_attention.layernorm_qkv._extra_state"] = torch.empty(0, dtype=torch.uint8)
    sd["model.layers.1.layernorm_mlp._extra_state"] = torch.tensor([1, 2, 3], dtype=torch.uint8)
    m2 = YxanulForCausalLM(tiny())
    m2.load_state_dict(sd)  # strict
    assert torch.equal(m2.model.layers[0].layernorm_mlp.fc1_weight, m.model.layers[0].layernorm_mlp.fc1_weight)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_golden_against_transformers_llama(kv_heads):
    """llm.c-style golden test: copy our weights into HF's LlamaForCausalLM, same logits (fp32)."""
    torch.manual_seed(0)
    cfg = config_from_preset("tiny", 1000, 64, num_key_value_heads=kv_heads, tie_word_embeddings=False)
    ours = YxanulForCausalLM(cfg).eval()
    ref = LlamaForCausalLM(LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=kv_heads, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
        max_position_embeddings=64, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        attn_implementation="eager")).eval()
    f = cfg.intermediate_size
    sd = {"model.embed_tokens.weight": ours.model.embed_tokens.weight, "model.norm.weight": ours.model.norm.weight,
          "lm_head.weight": ours.lm_head.weight}
    for i, layer in enumerate(ours.model.layers):
        a, m, p = layer.self_attention.layernorm_qkv, layer.layernorm_mlp, f"model.layers.{i}."
        sd.update({p + "input_layernorm.weight": a.layer_norm_weight, p + "self_attn.q_proj.weight": a.query_weight,
                   p + "self_attn.k_proj.weight": a.key_weight, p + "self_attn.v_proj.weight": a.value_weight,
                   p + "self_attn.o_proj.weight": layer.self_attention.proj.weight,
                   p + "post_attention_layernorm.weight": m.layer_norm_weight,
                   p + "mlp.gate_proj.weight": m.fc1_weight[:f], p + "mlp.up_proj.weight": m.fc1_weight[f:],
                   p + "mlp.down_proj.weight": m.fc2_weight})
    missing, unexpected = ref.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=False)
    assert not unexpected and all("rotary" in k for k in missing)
    x = torch.randint(0, 1000, (2, 40))
    with torch.no_grad():
        assert torch.allclose(ours(x).logits, ref(x).logits, atol=1e-5, rtol=1e-4)
