"""The TE backend against the REAL Transformer Engine, with or without a GPU (marker `te`).

Runs wherever `transformer_engine.pytorch` imports: on the device machine, and on a CPU machine with
the TE wheels (`bash scripts/device/cpu_te_env.sh`). TE modules refuse to be built without CUDA
(`TransformerEngineBaseModule.__init__` checks `torch.cuda.is_available()`), so on a CPU these tests
inject that one fact and build on the meta device: nothing is allocated and no kernel runs. They
check what TE's own classes make of yxanul's arguments (module tree, parameter names and shapes,
settings, RoPE convention); the numerics are `tests/precision/test_fp8_gpu.py`'s.
"""

import pytest
import torch

from yxanul import _te
from yxanul.errors import ConfigError
from yxanul.models import PRESETS, YxanulForCausalLM, config_from_preset
from yxanul.models.modeling_yxanul import YxanulRotaryEmbedding, apply_rotary

pytestmark = pytest.mark.te


@pytest.fixture
def build(monkeypatch):
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def make(preset="nano", backend="te", **kw):
        with torch.device("meta"):
            return YxanulForCausalLM(config_from_preset(preset, 8192, 256, backend=backend, **kw))

    return make


def shapes(model):
    return {k: tuple(v.shape) for k, v in model.state_dict().items() if not k.endswith("_extra_state")}


@pytest.mark.parametrize("preset", list(PRESETS))
def test_te_tree_has_the_torch_twins_names_and_shapes(build, preset):
    te_model, ref = build(preset), build(preset, backend="torch")
    assert shapes(te_model) == shapes(ref)
    assert type(te_model.model.layers[0]).__name__ == "TEDecoderLayer"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_te_tree_takes_the_dtype_the_torch_twin_takes(build, dtype):
    """`from_pretrained(..., dtype=torch.bfloat16)` builds under that default dtype: the TE blocks follow it
    as the embedding does (a TE tree left in fp32 beside a BF16 embedding broke generate() on the torch twin,
    i.e. every GRPO rollout, outside autocast: seen on an H200)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        te_model, ref = build(), build(backend="torch")
    finally:
        torch.set_default_dtype(old)
    got = {k: v.dtype for k, v in te_model.state_dict().items() if not k.endswith("_extra_state")}
    assert got == {k: v.dtype for k, v in ref.state_dict().items()} and set(got.values()) == {dtype}


@pytest.mark.parametrize("tied", [True, False])
def test_te_tree_ties_the_head_as_configured(build, tied):
    m = build(tie_word_embeddings=tied)
    assert (m.lm_head.weight is m.model.embed_tokens.weight) is tied
    assert ("lm_head.weight" in shapes(m)) and shapes(m) == shapes(build(backend="torch", tie_word_embeddings=tied))


@pytest.mark.parametrize("preset", ["medium", "yxanul-0.6b"])  # MHA and GQA (12 heads, 4 KV groups)
def test_te_layers_have_the_documented_settings(build, preset):
    m = build(preset)
    c = m.config
    for layer in m.model.layers:
        sa, mlp = layer.self_attention, layer.layernorm_mlp
        assert layer.hidden_dropout == 0.0 and sa.core_attention.attention_dropout == 0.0
        assert layer.self_attn_mask_type == sa.core_attention.attn_mask_type == "causal"
        assert sa.qkv_format == sa.core_attention.qkv_format == "bshd"      # batch-first
        assert sa.num_gqa_groups == c.num_key_value_heads and sa.num_attention_heads == c.num_attention_heads
        assert sa.hidden_size_per_attention_head == c.head_dim
        assert not sa.qkv_weight_interleaved                                  # separate q/k/v weights
        assert sa.layernorm_qkv.normalization == mlp.normalization == "RMSNorm"
        assert sa.layernorm_qkv.eps == mlp.eps == c.rms_norm_eps
        assert mlp.activation == "swiglu"
        assert not (sa.layernorm_qkv.use_bias or sa.proj.use_bias or mlp.use_bias)
        assert all(p.dtype == torch.float32 and p.device.type == "meta" for p in layer.parameters())
        assert not any("bias" in n for n, _ in layer.named_parameters())
    assert isinstance(m.model.norm, _te.te.RMSNorm) and m.model.norm.eps == c.rms_norm_eps


def test_te_extra_state_is_never_a_pickle(build):
    m = build()
    extra = {k: v for k, v in m.state_dict().items() if k.endswith("_extra_state")}
    assert extra and all(torch.is_tensor(v) and v.numel() == 0 for v in extra.values())
    layer = m.model.layers[0].layernorm_mlp
    assert layer.set_extra_state(torch.empty(0, dtype=torch.uint8)) is None   # an empty one loads as a no-op


def test_rope_matches_te_unfused_rotary():
    """yxanul's rotation (torch backend) == TE's `apply_rotary_pos_emb` (non-interleaved, bshd) on the
    freqs both backends get from `YxanulRotaryEmbedding` ([T, 1, 1, hd] = cat(f, f), TE's layout)."""
    from transformer_engine.pytorch.attention.rope import apply_rotary_pos_emb

    torch.manual_seed(0)
    freqs = YxanulRotaryEmbedding(64, 10000.0)(37)                # [T, 1, 1, hd]
    x = torch.randn(2, 37, 4, 64)                                 # (B, T, nh, hd)
    ours = apply_rotary(x, freqs)
    theirs = apply_rotary_pos_emb(x, freqs, tensor_format="bshd", fused=False)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error; this machine has a GPU")
def test_te_backend_without_a_gpu_is_a_one_line_config_error():
    """TE imports on a CPU machine, but its modules raise "TransformerEngine needs CUDA." deep inside
    their constructors; yxanul says what to do instead."""
    with pytest.raises(ConfigError, match="backend.*need a CUDA device.*backend='torch'"):
        YxanulForCausalLM(config_from_preset("nano", 1000, 64, backend="te"))


def test_te_model_saves_pretrained_and_loads_into_the_torch_backend(build, tmp_path):
    """Export path: a TE-trained model's `save_pretrained` folder loads with `backend="torch"` on a
    machine without TE/GPU, weight for weight (TE parameters held on CPU; no kernel runs)."""
    from transformers import AutoModelForCausalLM

    m = build()
    m.to_empty(device="cpu")
    m.tie_weights()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    m.save_pretrained(tmp_path)
    assert m.config.backend == "te"
    ref = AutoModelForCausalLM.from_pretrained(tmp_path, backend="torch")
    assert ref.config.backend == "torch" and ref.lm_head.weight is ref.model.embed_tokens.weight
    ours = {k: v for k, v in m.state_dict().items() if not k.endswith("_extra_state")}
    assert ours.keys() == ref.state_dict().keys()
    assert all(torch.equal(v, ref.state_dict()[k]) for k, v in ours.items())


@pytest.mark.parametrize("preset", ["nano", "yxanul-0.6b"])  # GQA both
def test_fused_qkv_keeps_the_state_dict_names_and_round_trips(build, preset, tmp_path):
    """fuse_qkv_params: ONE TE QKV weight, saved as query/key/value_weight (same names and shapes as the
    torch twin), loaded back from them; a torch-backend model loads the same tensors."""
    m = build(preset, fuse_qkv_params=True)
    qkv = m.model.layers[0].self_attention.layernorm_qkv
    assert [n for n, _ in qkv.named_parameters()] == ["layer_norm_weight", "weight"]
    assert shapes(m) == shapes(build(preset, backend="torch"))
    if preset != "nano":
        return
    twin, again = _through_the_torch_twin(build, m, tmp_path, preset, fuse_qkv_params=True)
    h, kv = m.config.hidden_size, m.config.num_key_value_heads * m.config.head_dim
    q, k, v = qkv.weight.detach().split([h, kv, kv])
    a = twin.model.layers[0].self_attention.layernorm_qkv
    assert torch.equal(a.query_weight, q) and torch.equal(a.key_weight, k) and torch.equal(a.value_weight, v)
    assert torch.equal(again.model.layers[0].self_attention.layernorm_qkv.weight, qkv.weight)


def _through_the_torch_twin(build, m, tmp_path, preset, **kw):
    """(the torch-backend model `from_pretrained` makes of TE model ``m``'s save_pretrained folder, with random
    weights filled in; a new TE model of ``kw`` that loaded the twin's state dict)."""
    from transformers import AutoModelForCausalLM

    m.to_empty(device="cpu")
    m.tie_weights()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    m.save_pretrained(tmp_path)
    twin = AutoModelForCausalLM.from_pretrained(tmp_path, backend="torch")
    again = build(preset, **kw)
    again.to_empty(device="cpu")
    again.load_state_dict(twin.state_dict(), strict=False)
    return twin, again


@pytest.mark.parametrize("preset", ["nano", "tiny"])  # GQA (4 heads, 2 KV groups) and MHA
def test_fused_qkv_rope_groups_the_weight_per_kv_head_under_the_same_names(build, preset, tmp_path):
    """fuse_qkv_rope: TE's MHA holds ONE QKV weight in its grouped layout (qkv_weight_interleaved, the rows TE's
    fused QKV RoPE kernel reads); it saves as the torch twin's q/k/v, head for head, and loads back from them."""
    if _te.fused_qkv_rope is None:
        pytest.skip(f"TE {_te.te_version} has no apply_fused_qkv_rotary_pos_emb")
    m = build(preset, fuse_qkv_rope=True)
    layer = m.model.layers[0]
    assert layer.self_attention.qkv_weight_interleaved and layer.self_attention.layernorm_qkv.weight.dim() == 2
    assert shapes(m) == shapes(build(preset, backend="torch"))
    c = m.config
    ng, g, hd = c.num_key_value_heads, c.num_attention_heads // c.num_key_value_heads, c.head_dim
    assert layer.rope_split == [g * hd, hd, hd]
    twin, again = _through_the_torch_twin(build, m, tmp_path, preset, fuse_qkv_rope=True)
    fused = layer.self_attention.layernorm_qkv.weight.detach().view(ng, g + 2, hd, -1)
    a = twin.model.layers[0].self_attention.layernorm_qkv
    q, k = a.query_weight.view(ng * g, hd, -1), a.key_weight.view(ng, hd, -1)
    assert torch.equal(fused[ng - 1, g - 1], q[ng * g - 1]) and torch.equal(fused[ng - 1, g], k[ng - 1])
    assert torch.equal(fused[0, g + 1], a.value_weight.view(ng, hd, -1)[0])
    loaded = again.model.layers[0].self_attention.layernorm_qkv.weight
    assert torch.equal(loaded, layer.self_attention.layernorm_qkv.weight)


def test_norm_kernel_cudnn_switches_te_for_the_process_when_the_tree_is_built(build, monkeypatch):
    """TE's blocks ask for their RMSNorm kernels as they are built: ``cudnn`` sets TE's two switches before any
    norm runs; a later tree asking for TE's own kernels in the same process is one line (TE keeps its first
    reading: the GPU test runs each choice in its own process)."""
    import os

    monkeypatch.setattr(_te, "_norm_kernel", None)
    for var in _te.CUDNN_NORM_ENV:
        monkeypatch.setenv(var, "")
    build(norm_kernel="cudnn")
    assert [os.environ[v] for v in _te.CUDNN_NORM_ENV] == ["1", "1"]
    with pytest.raises(ConfigError, match="^config key 'norm_kernel': expected cudnn: TE takes one normalization"):
        build()
    build(backend="torch")  # the torch twin has no TE norm: any choice, any time
