"""YxanulForCausalLM on its real code paths (torch backend, CPU, fp32): forward/loss, TE-shaped names,
init, activation checkpointing (generation: test_generation.py), save/load, TE `_extra_state` tolerance, and a golden
reference against transformers' own LlamaForCausalLM with the same weights."""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from yxanul import _te
from yxanul.errors import ConfigError, UserError
from yxanul.models import YxanulConfig, YxanulForCausalLM, resolve_backend
from yxanul.models.args import ModelArgs
from yxanul.models.build import build_model, describe, load_weights

LAYER_KEYS = ["self_attention.layernorm_qkv.layer_norm_weight", "self_attention.layernorm_qkv.query_weight",
              "self_attention.layernorm_qkv.key_weight", "self_attention.layernorm_qkv.value_weight",
              "self_attention.proj.weight", "layernorm_mlp.layer_norm_weight", "layernorm_mlp.fc1_weight",
              "layernorm_mlp.fc2_weight"]


def ids(B=2, T=24, seed=1):
    return torch.randint(0, 1000, (B, T), generator=torch.Generator().manual_seed(seed))


def test_forward_backward_shapes_and_initial_loss(tiny_config):
    torch.manual_seed(0)
    model = YxanulForCausalLM(tiny_config())
    x = ids(2, 32)
    out = model(x, labels=x)
    assert out.logits.shape == (2, 32, 1024) and out.loss.dtype == torch.float32
    assert abs(out.loss.item() - math.log(1024)) < 0.1   # small init: near-uniform predictions
    out.loss.backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n


def test_labels_and_shift_labels_give_the_same_loss(tiny_config):
    model = YxanulForCausalLM(tiny_config()).eval()
    x = ids(2, 17)
    with torch.no_grad():
        logits = model(x).logits
        hf = model(x, labels=x).loss
        aligned = model(x, shift_labels=F.pad(x[:, 1:], (0, 1), value=-100)).loss
        manual = F.cross_entropy(logits[:, :-1].reshape(-1, 1024), x[:, 1:].reshape(-1))
        masked = x.clone()
        masked[:, :8] = -100                                  # ignore_index -100 drops those targets
        part = model(x, labels=masked).loss
    assert torch.allclose(hf, manual, atol=1e-6) and torch.allclose(aligned, manual, atol=1e-6)
    assert torch.allclose(part, F.cross_entropy(logits[:, 7:-1].reshape(-1, 1024), x[:, 8:].reshape(-1)), atol=1e-6)


def test_state_dict_names_are_exactly_the_contract(tiny_config):
    for tied in (True, False):
        model = YxanulForCausalLM(tiny_config(num_hidden_layers=2, tie_word_embeddings=tied))
        expected = {f"model.layers.{i}.{k}" for i in range(2) for k in LAYER_KEYS}
        expected |= {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
        assert set(model.state_dict()) == expected                     # no inv_freq, no biases
        assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    fc1 = model.model.layers[0].layernorm_mlp.fc1_weight
    assert fc1.shape == (2 * 704, 256)                                 # cat([gate, up])


def test_gqa_shapes(tiny_config):
    model = YxanulForCausalLM(tiny_config(num_attention_heads=8, num_key_value_heads=2))
    qkv = model.model.layers[0].self_attention.layernorm_qkv
    assert qkv.query_weight.shape == (256, 256) and qkv.key_weight.shape == (64, 256) == qkv.value_weight.shape
    assert model(ids()).logits.shape == (2, 24, 1024)


def test_rotary_matches_te_layout(tiny_config):
    rot = YxanulForCausalLM(tiny_config()).model.rotary_emb
    f = rot(10)
    assert f.shape == (10, 1, 1, 64) and f.dtype == torch.float32
    assert torch.equal(f[..., :32], f[..., 32:])                      # cat(f, f): non-interleaved
    assert torch.allclose(f[3, 0, 0, 1], torch.tensor(3 * 10000 ** (-2 / 64)))
    assert "inv_freq" in dict(rot.named_buffers()) and not rot.state_dict()   # non-persistent
    rot.to(torch.bfloat16)                                            # a cast must not degrade positions
    assert torch.equal(rot(10), f)


def test_bf16_forward(tiny_config):
    model = YxanulForCausalLM(tiny_config()).to(torch.bfloat16)
    out = model(ids(), labels=ids())
    assert out.logits.dtype == torch.bfloat16 and out.loss.dtype == torch.float32 and torch.isfinite(out.loss)


def test_residual_stream_runs_in_the_autocast_dtype_like_te(tiny_config):
    """te.TransformerLayer casts its input to the autocast dtype (a bf16 residual stream); the twin must
    too, or the GPU golden parity test measures a precision choice instead of the implementation."""
    model = YxanulForCausalLM(tiny_config()).eval()
    seen = []
    hooks = [layer.register_forward_pre_hook(lambda m, a, k: seen.append(a[0].dtype if a else k["hidden_states"].dtype),
                                             with_kwargs=True) for layer in model.model.layers]
    final = model.model.norm.register_forward_hook(lambda m, a, out: seen.append(("norm", a[0].dtype, out.dtype)))
    with torch.no_grad():
        model(ids())
        assert seen == [torch.float32] * len(model.model.layers) + [("norm", torch.float32, torch.float32)]
        seen.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(ids(), labels=ids())
    for h in hooks + [final]:
        h.remove()
    # layer 0 receives the fp32 embedding and casts it; every later layer and the final norm get bf16
    assert seen == [torch.float32] + [torch.bfloat16] * (len(model.model.layers) - 1) + [
        ("norm", torch.bfloat16, torch.bfloat16)]
    assert torch.isfinite(out.loss)


def test_init_weights(tiny_config):
    m = YxanulForCausalLM(tiny_config())
    layer = m.model.layers[0]
    q = layer.self_attention.layernorm_qkv.query_weight
    assert not torch.all(q == 1) and abs(q.std().item() - 0.02) < 0.002
    assert torch.all(layer.self_attention.layernorm_qkv.layer_norm_weight == 1)
    assert torch.all(layer.layernorm_mlp.layer_norm_weight == 1) and torch.all(m.model.norm.weight == 1)
    out_std = 0.02 / math.sqrt(2 * m.config.num_hidden_layers)
    for w in (layer.layernorm_mlp.fc2_weight, layer.self_attention.proj.weight):
        assert abs(w.std().item() - out_std) < 0.1 * out_std
    assert abs(m.model.embed_tokens.weight.std().item() - 0.02) < 0.002


def test_init_weights_ignores_class_names():
    """transformers' default init fills any '*LayerNorm*' module's `weight` with ones: TE's
    LayerNormLinear.weight is a QKV matrix. Ours goes by parameter shape/name."""
    class LayerNormLinear(nn.Module):  # same class name as TE's
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(64, 32))
            self.layer_norm_weight = nn.Parameter(torch.zeros(32))

    m = YxanulForCausalLM(YxanulConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=64, backend="torch"))
    mod = LayerNormLinear()
    m._init_weights(mod)
    assert not torch.all(mod.weight == 1) and mod.weight.std() > 0 and torch.all(mod.layer_norm_weight == 1)


@pytest.mark.parametrize("api", ["set_activation_checkpointing", "gradient_checkpointing_enable",
                                 "activation_checkpointing_enable"])
def test_gradient_checkpointing_same_grads(tiny_config, api):
    torch.manual_seed(0)
    a, b = YxanulForCausalLM(tiny_config()), YxanulForCausalLM(tiny_config())
    b.load_state_dict(a.state_dict())
    if not hasattr(b, api):
        pytest.skip(f"transformers {transformers.__version__} has no {api} (added in 5.23)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)   # gradient_checkpointing_enable: deprecated alias
        getattr(b, api)(*([True] if api == "set_activation_checkpointing" else []))
    assert all(layer.gradient_checkpointing for layer in b.model.layers)
    assert b.activation_checkpointing and not a.activation_checkpointing
    x = ids(2, 16)
    a(x, labels=x).loss.backward()
    b(x, labels=x).loss.backward()
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-7), n


@pytest.mark.parametrize("tied", [True, False])
def test_save_pretrained_from_pretrained_round_trip(tmp_path, tiny_config, tied):
    m = YxanulForCausalLM(tiny_config(tie_word_embeddings=tied))
    m.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    r, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert isinstance(r, YxanulForCausalLM) and r.config.backend == "torch"
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert (r.lm_head.weight is r.model.embed_tokens.weight) == tied
    for k, v in m.state_dict().items():
        assert torch.equal(v, r.state_dict()[k]), k
    assert torch.equal(r.model.rotary_emb.inv_freq, m.model.rotary_emb.inv_freq)  # recomputed, not saved
    x = ids(1, 8)
    assert torch.equal(m(x).logits, r(x).logits)


@pytest.mark.parametrize("tied", [True, False])
def test_resize_token_embeddings_keeps_the_old_vocabularys_logits(tiny_config, tied):
    torch.manual_seed(0)
    m = YxanulForCausalLM(tiny_config(tie_word_embeddings=tied)).eval()
    ids = torch.randint(0, 1000, (2, 16))
    with torch.no_grad():
        before = m(ids).logits
    m.resize_token_embeddings(1024 + 64)
    with torch.no_grad():
        after = m(ids).logits
    assert m.config.vocab_size == 1088 and after.shape[-1] == 1088 and type(m.lm_head).__name__ == "LMHead"
    assert torch.allclose(after[..., :1024], before, atol=1e-6)
    assert (m.lm_head.weight is m.model.embed_tokens.weight) == tied
    assert [n for n, _ in m.named_parameters()].count("lm_head.weight") == (not tied)


def test_auto_classes_from_config():
    cfg = AutoConfig.for_model("yxanul", vocab_size=128, hidden_size=64, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=128, backend="torch")
    assert isinstance(cfg, YxanulConfig)
    assert isinstance(AutoModelForCausalLM.from_config(cfg), YxanulForCausalLM)


def test_te_extra_state_keys_are_tolerated(tmp_path, tiny_config):
    m = YxanulForCausalLM(tiny_config())
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    extra = {"model.layers.0.self_attention.layernorm_qkv._extra_state": torch.empty(0, dtype=torch.uint8),
             "model.layers.0.self_attention.core_attention._extra_state": torch.empty(0, dtype=torch.uint8),
             "model.layers.1.layernorm_mlp._extra_state": torch.tensor([1, 2, 3], dtype=torch.uint8)}
    m2 = YxanulForCausalLM(tiny_config())
    m2.load_state_dict({**sd, **extra})                       # strict: a TE checkpoint loads
    assert torch.equal(m2.model.layers[1].layernorm_mlp.fc1_weight, m.model.layers[1].layernorm_mlp.fc1_weight)
    # ... and through from_pretrained, with no "UNEXPECTED" load report
    m.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    save_file({**state, **extra}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    r, info = YxanulForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["unexpected_keys"] and not info["missing_keys"]
    assert torch.equal(r.model.layers[1].layernorm_mlp.fc2_weight, m.model.layers[1].layernorm_mlp.fc2_weight)


def test_backend_resolution(tiny_config):
    expected = "te" if (_te.TE_AVAILABLE and torch.cuda.is_available()) else "torch"
    assert resolve_backend("auto") == expected and resolve_backend("torch") == "torch"
    with pytest.raises(ConfigError, match="backend"):
        resolve_backend("jax")
    m = YxanulForCausalLM(tiny_config(backend="auto"))
    assert m.config.backend == expected                       # stored resolved: save/load round-trips it
    if not _te.TE_AVAILABLE:
        with pytest.raises(ConfigError, match="backend"):
            YxanulForCausalLM(tiny_config(backend="te"))


def test_model_args_build_describe_and_init_from(tmp_path):
    with pytest.raises(ConfigError, match="nano"):
        ModelArgs(model="huge")
    with pytest.raises(ConfigError, match="seq_length"):
        ModelArgs(seq_length=1)
    with pytest.raises(ConfigError, match="backend"):
        ModelArgs(backend="cuda")
    args = ModelArgs(model="nano", backend="torch", seq_length=32, tie_word_embeddings=False)
    m = build_model(args, vocab_size=1000)
    assert m.config.vocab_size == 1024 and m.config.max_position_embeddings == 32 and not m.config.tie_word_embeddings
    line = describe(m.config)
    assert line.startswith("model: ") and f"{sum(p.numel() for p in m.parameters()) / 1e6:.2f}M" in line
    assert "backend torch" in line and "\n" not in line
    m.save_pretrained(tmp_path)
    again = ModelArgs(backend="torch", seq_length=32, tie_word_embeddings=False, init_from=str(tmp_path))
    m2 = build_model(again, 1000)
    assert torch.equal(m2.lm_head.weight, m.lm_head.weight)
    with pytest.raises(UserError, match=f"init_from '{tmp_path / 'nope'}': no such file or directory"):
        build_model(ModelArgs(backend="torch", init_from=str(tmp_path / "nope")), 1000)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no model"):
        build_model(ModelArgs(backend="torch", init_from=str(tmp_path / "empty")), 1000)
    # a transformers.Trainer checkpoint-N: a save_pretrained folder with the Trainer's own trainer_state.json
    hf = tmp_path / "out" / "checkpoint-4"
    m.save_pretrained(hf)
    (hf / "trainer_state.json").write_text('{"global_step": 4, "log_history": []}')
    assert torch.equal(build_model(ModelArgs(backend="torch", seq_length=32, tie_word_embeddings=False,
                                             init_from=str(hf)), 1000).lm_head.weight, m.lm_head.weight)
    with pytest.raises(UserError, match="shapes"):
        build_model(ModelArgs(backend="torch", tie_word_embeddings=False, init_from=str(tmp_path)), 50000)
    ckpt = build_model(ModelArgs(backend="torch", gradient_checkpointing=True), 1000)
    assert ckpt.model.layers[0].gradient_checkpointing
    # the tie differs: the untied save's trained head is never dropped into a tied model, nor the reverse guessed
    with pytest.raises(UserError, match="trained apart from the embedding; pass --tie_word_embeddings false"):
        build_model(ModelArgs(backend="torch", seq_length=32, init_from=str(tmp_path)), 1000)
    tied = build_model(ModelArgs(backend="torch", seq_length=32), 1000)
    tied.save_pretrained(tmp_path / "tied")
    with pytest.raises(UserError, match="is the embedding \\(tied\\); pass --tie_word_embeddings true"):
        build_model(ModelArgs(backend="torch", seq_length=32, tie_word_embeddings=False,
                              init_from=str(tmp_path / "tied")), 1000)


def test_init_from_tied_checkpoint_that_kept_the_head_name(tmp_path, tiny_config):
    m = YxanulForCausalLM(tiny_config())
    state = {k: v.clone() for k, v in m.state_dict().items() if k != "model.embed_tokens.weight"}
    save_file(state, tmp_path / "model.safetensors")
    m2 = YxanulForCausalLM(tiny_config())
    load_weights(m2, str(tmp_path))
    assert torch.equal(m2.model.embed_tokens.weight, m.model.embed_tokens.weight)
    assert m2.lm_head.weight is m2.model.embed_tokens.weight


@pytest.mark.parametrize("kv_heads,tied", [(4, False), (2, False), (1, True)])
def test_golden_against_transformers_llama(tiny_config, kv_heads, tied):
    """llm.c-style golden test: split our TE-shaped weights into HF LlamaForCausalLM's q/k/v/o,
    gate/up/down and norms; the independent implementation must give the same fp32 logits."""
    torch.manual_seed(0)
    cfg = tiny_config(num_key_value_heads=kv_heads, tie_word_embeddings=tied, rope_theta=500000.0)
    ours = YxanulForCausalLM(cfg).eval()
    with torch.no_grad():  # random norm weights too, so a mixed-up norm cannot hide
        for p in ours.parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    ref = LlamaForCausalLM(LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=kv_heads, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
        max_position_embeddings=64, tie_word_embeddings=tied, attention_bias=False, mlp_bias=False,
        hidden_act="silu", attn_implementation="eager")).eval()
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
    x = ids(2, 40)
    with torch.no_grad():
        a, b = ours(x).logits, ref(x).logits
    assert (a - b).abs().max().item() < 1e-5


def test_return_logits_false_keeps_the_loss_and_skips_accelerates_fp32_copy(tiny_config):
    """Through a prepared model accelerate copies every bf16 output to fp32 (convert_outputs_to_fp32):
    for logits that is B*T*V*4 bytes per micro-step. The trainer's steps ask for the loss only."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    torch.manual_seed(0)
    model = YxanulForCausalLM(tiny_config())
    try:
        prepared = Accelerator(mixed_precision="bf16", cpu=True).prepare(model)
        x = ids(2, 16)
        full, lean = prepared(x, shift_labels=x), prepared(x, shift_labels=x, return_logits=False)
        assert full.logits.dtype == torch.float32 and full.logits.shape == (2, 16, model.config.vocab_size)
        assert lean.logits is None and torch.equal(full.loss, lean.loss)
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()


def test_fused_qkv_hooks_save_and_load_the_contract_names(tiny_config):
    """The hooks TE's fused QKV module gets (fuse_qkv_params), on a module with TE's fused layout
    (`weight` = cat[q, k, v]): loaded from the torch twin's names, saved back under them."""
    from yxanul.models.state_dict import fuse_split_qkv, split_fused_qkv

    torch.manual_seed(0)
    cfg = tiny_config()                                         # GQA: 4 heads, 2 kv
    twin = YxanulForCausalLM(cfg).model.layers[0].self_attention.layernorm_qkv
    h, kv = cfg.hidden_size, cfg.num_key_value_heads * cfg.head_dim
    fused = nn.Module()
    fused.layer_norm_weight = nn.Parameter(torch.ones(h))
    fused.weight = nn.Parameter(torch.zeros(h + 2 * kv, h))
    fused.register_state_dict_post_hook(split_fused_qkv((h, kv, kv)))
    fused.register_load_state_dict_pre_hook(fuse_split_qkv)
    fused.load_state_dict(twin.state_dict())                     # strict: every q/k/v name consumed
    assert torch.equal(fused.weight, torch.cat([twin.query_weight, twin.key_weight, twin.value_weight]))
    saved = fused.state_dict()
    assert set(saved) == set(twin.state_dict()) == {"layer_norm_weight", "query_weight", "key_weight", "value_weight"}
    assert all(torch.equal(saved[k], v) for k, v in twin.state_dict().items())
