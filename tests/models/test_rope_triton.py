"""The Triton QKV RoPE kernel (``rope_kernel: triton``) on a CPU: run by Triton's interpreter against the torch
twin's rotation (`apply_rotary`; fp32 in, the same q/k/v and input gradient to the bit), and compiled for sm_90
with Triton's own ptxas (it builds, with 128-bit accesses). Where triton is not installed (the CPU CI: CUDA builds
of torch bring it) this skips; on a GPU, tests/models/test_qkv_rope_gpu.py compares the running kernel with TE's."""

import importlib
import os

import pytest
import torch

from yxanul.models.modeling_torch import apply_rotary
from yxanul.models.modeling_yxanul import YxanulRotaryEmbedding


@pytest.fixture
def kernel(monkeypatch):
    pytest.importorskip("triton", reason="triton is not installed (CUDA builds of torch bring it)")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: tests/models/test_qkv_rope_gpu.py runs the compiled kernel")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read when the kernels are decorated: import under it
    import yxanul.models.rope_triton as module

    yield importlib.reload(module).fused_qkv_rope
    monkeypatch.delenv("TRITON_INTERPRET")
    importlib.reload(module)


def _reference(packed, freqs, g):
    B, T, ng, width = packed.shape
    x = packed.view(B, T, ng, g + 2, width // (g + 2))                   # (B, T, ng, g + 2, hd)
    q = x[:, :, :, :g].reshape(B, T, ng * g, -1)                          # head h = group * g + j
    return apply_rotary(q, freqs), apply_rotary(x[:, :, :, g], freqs), x[:, :, :, g + 1]


# (B, T, ng, g, hd; positions of the angles): rows not a multiple of the kernel's block; angles for more positions;
# a head whose half is not a power of two
@pytest.mark.parametrize("shape", [(2, 37, 3, 2, 16, 37), (1, 40, 2, 1, 8, 64), (1, 9, 2, 3, 24, 9)])
def test_the_triton_kernel_rotates_and_splits_as_the_torch_twin(kernel, shape):
    B, T, ng, g, hd, positions = shape
    gen = torch.Generator().manual_seed(0)
    packed = torch.randn(B, T, ng, (g + 2) * hd, generator=gen)
    freqs = YxanulRotaryEmbedding(hd, 10000.0)(positions)                # [positions, 1, 1, hd]
    x, x_ref = packed.clone().requires_grad_(True), packed.clone().requires_grad_(True)
    out, ref = kernel(x, freqs, g), _reference(x_ref, freqs[:T], g)
    upstream = [torch.randn(t.shape, generator=gen) for t in ref]
    torch.autograd.backward(out, upstream)
    torch.autograd.backward(ref, upstream)
    for a, b in zip(out, ref):
        assert a.shape == b.shape and a.is_contiguous()
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-6, atol=1e-6)
    assert os.environ["TRITON_INTERPRET"] == "1"


@pytest.mark.parametrize("hd", [64, 128, 96])
def test_the_kernel_compiles_for_hopper_with_128_bit_accesses(hd, monkeypatch):
    """Compiled here, without a GPU (Triton's bundled ptxas, target sm_90): forward and backward build, and every
    global access of the bf16 data and the fp32 tables is a 128-bit vector one (the point of the kernel: TE's
    moves one 16-bit element per thread)."""
    pytest.importorskip("triton", reason="triton is not installed (CUDA builds of torch bring it)")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    import yxanul.models.rope_triton as module

    fn = importlib.reload(module)._qkv_rope_kernel
    pointers = {"packed": "*bf16", "q": "*bf16", "k": "*bf16", "v": "*bf16", "cos": "*fp32", "sin": "*fp32"}
    consts = {"G": 2, "HD": hd, "BLOCK_R": module.BLOCK_ROWS, "BLOCK_H": triton.next_power_of_2(hd // 2)}
    for backward in (False, True):
        signature = {**pointers, "n_rows": "i32", "T": "i32", "NG": "i32",
                     **{k: "constexpr" for k in (*consts, "BACKWARD")}}
        constexprs = {(fn.arg_names.index(k),): v for k, v in {**consts, "BACKWARD": backward}.items()}
        attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(pointers))}  # torch's allocations are aligned
        ptx = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                             target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
        assert "ld.global.v4" in ptx and "st.global.v4" in ptx
        assert not any(f"{op}.global.{w}" in ptx for op in ("ld", "st") for w in ("b16", "v2.b16", "u16"))
