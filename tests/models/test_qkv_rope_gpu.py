"""`fuse_qkv_rope` on a GPU: with the same weights, a block whose q/k RoPE and q/k/v split run as one fused QKV
kernel (TE's, or yxanul's Triton kernel: ``rope_kernel``) computes what TE's own attention path computes
(`fuse_qkv_params`: MultiheadAttention splits the projection and rotates q and k apart), forward and backward, in
BF16 and FP8; and trains the same, eager and graphed. The Triton kernel alone returns what TE's returns."""

import pytest
import torch

from yxanul.models import config_from_preset
from yxanul.models.modeling_yxanul import YxanulForCausalLM
from yxanul.models.state_dict import grouped_to_qkv

pytestmark = [pytest.mark.gpu, pytest.mark.te]

SHAPES = {"gqa": {}, "mha": {"num_key_value_heads": 4}}  # nano: 4 heads, 2 KV groups; or one KV head per head
KERNELS = ["te", "triton"]


def _needs(kernel: str) -> None:
    if kernel == "triton":
        pytest.importorskip("triton", reason="rope_kernel triton: triton is not installed")


def _model(shape: str, rope: bool, state=None, **kw):
    config = config_from_preset("nano", 1024, 64, backend="te", fuse_qkv_params=True, fuse_qkv_rope=rope,
                                **SHAPES[shape], **kw)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = YxanulForCausalLM(config)
    if state is not None:
        model.load_state_dict(state)  # q/k/v names: the load hook lays them out in this model's rows
    return model


def _context(precision: str):
    from yxanul import _te

    if precision == "bf16":
        return torch.autocast("cuda", torch.bfloat16)
    _te.reset_fp8_state()
    return _te.autocast(enabled=True, recipe=_te.te_recipe.DelayedScaling())


def _block_update(model, x, precision):
    """(layer 0's residual update f(x) - x, d<update, r>/dx, the QKV weight's gradient as (q, k, v))."""
    layer = model.model.layers[0]
    x = x.clone().requires_grad_(True)
    with _context(precision):
        update = layer(x, model.model.rotary_emb(x.shape[1])) - x                # (B, T, C)
    update.float().backward(torch.linspace(-1, 1, x.shape[-1], device=x.device).expand(update.shape))  # d<u, r>
    grad = layer.self_attention.layernorm_qkv.weight.grad
    c = model.config
    kv = c.num_key_value_heads * c.head_dim
    qkv = (grouped_to_qkv(grad, (c.num_key_value_heads, c.num_attention_heads // c.num_key_value_heads, c.head_dim))
           if layer.rope_split else grad.split([c.hidden_size, kv, kv]))
    return update.detach().float(), x.grad.float(), [t.float() for t in qkv]


def _rel(a, b) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("precision", ["bf16", "fp8"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_fused_qkv_rope_block_computes_what_te_attention_computes(shape, precision, kernel):
    from yxanul import _te

    _needs(kernel)
    if precision == "fp8" and not _te.availability()["delayed"][0]:
        pytest.skip("FP8 (delayed scaling) is not available on this GPU")
    ref = _model(shape, rope=False)
    ours = _model(shape, rope=True, state=ref.state_dict(), rope_kernel=kernel)
    x = torch.randn(2, 64, ref.config.hidden_size, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    (u_ref, dx_ref, w_ref), (u, dx, w) = _block_update(ref, x, precision), _block_update(ours, x, precision)
    # The same products in the same kernels, but the QKV GEMM's output columns are permuted and the attention
    # reads contiguous q/k/v instead of strided views: rounding apart, a few BF16 ulps (2^-8) at most. A query
    # head wired to another KV group, or a rotation of the wrong half, moves the update by O(1) of its norm.
    assert _rel(u, u_ref) < 2**-5, (_rel(u, u_ref), precision)
    assert _rel(dx, dx_ref) < 2**-5
    assert all(_rel(a, b) < 2**-4 for a, b in zip(w, w_ref)), [_rel(a, b) for a, b in zip(w, w_ref)]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("graphs", [False, True])
def test_fused_qkv_rope_trains_like_te_attention(graphs, kernel):
    """Through the trainer's one step (precision plan, optimizer, graphs captured from the fused forward)."""
    from yxanul import _te
    from yxanul.precision import resolve_precision
    from yxanul.tools.bench import precision_args
    from yxanul.training.optim import OptimArgs, build_optimizer
    from yxanul.training.step import train_step

    _needs(kernel)
    state = _model("gqa", rope=False).state_dict()
    losses = {}
    for rope in (False, True):
        _te.reset_fp8_state()
        model = _model("gqa", rope=rope, state=state, cuda_graphs=graphs, rope_kernel=kernel if rope else "te").train()
        plan = resolve_precision(precision_args("bf16", 0, "none"), model.config, say=lambda *a: None)
        plan.prepare_model(model, say=lambda *a: None)
        opt = build_optimizer(model, OptimArgs())
        gen = torch.Generator().manual_seed(3)
        batches = [torch.randint(0, 1024, (8, 65), generator=gen).cuda() for _ in range(2)]
        losses[rope] = [train_step(model, opt, [batches[i % 2]], plan=plan, max_grad_norm=1.0, lr=1e-3).loss.item()
                        for i in range(4)]
    assert losses[True] == pytest.approx(losses[False], rel=2**-8), losses  # as graphs vs eager (test_cuda_graphs)
    assert losses[True][-1] < losses[True][0]


@pytest.mark.parametrize("groups", [(16, 1, 64), (4, 4, 128), (2, 3, 96)])  # (ng, g, hd): medium, GQA, odd g + hd/2
def test_the_triton_kernel_returns_what_tes_kernel_returns(groups):
    """Same packed projection and angles: q, k, v and the packed gradient equal TE's kernel's up to one BF16 rounding
    (both rotate in fp32; cos/sin come from torch's cosf/sinf here, TE's sincosf there)."""
    pytest.importorskip("triton", reason="rope_kernel triton: triton is not installed")
    from yxanul import _te
    from yxanul.models.modeling_yxanul import YxanulRotaryEmbedding
    from yxanul.models.rope_triton import fused_qkv_rope

    ng, g, hd = groups
    B, T = 2, 300  # T not a multiple of the kernel's row block
    gen = torch.Generator("cuda").manual_seed(0)
    packed = torch.randn(B, T, ng, (g + 2) * hd, device="cuda", generator=gen).bfloat16()
    freqs = YxanulRotaryEmbedding(hd, 10000.0).cuda()(T)
    outs, grads = {}, {}
    for kernel in ("te", "triton"):
        x = packed.clone().requires_grad_(True)
        if kernel == "te":
            q, k, v = _te.fused_qkv_rope(x, freqs, freqs, [g * hd, hd, hd], tensor_format="bshd")
            q, k, v = (t.reshape(B, T, -1, hd) for t in (q, k, v))
        else:
            q, k, v = fused_qkv_rope(x, freqs, g)
        dq, dk, dv = (torch.randn(t.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(i)).bfloat16()
                      for i, t in enumerate((q, k, v)))
        torch.autograd.backward((q, k, v), (dq, dk, dv))
        outs[kernel], grads[kernel] = (q, k, v), x.grad
    for a, b in zip(outs["triton"], outs["te"]):
        assert a.shape == b.shape and a.is_contiguous()
        torch.testing.assert_close(a, b, rtol=2**-7, atol=2**-12)
    assert torch.equal(outs["triton"][2], outs["te"][2])  # v: a copy
    torch.testing.assert_close(grads["triton"], grads["te"], rtol=2**-7, atol=2**-12)
