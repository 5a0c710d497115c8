"""The Triton QKV RoPE kernel (``rope_kernel: triton``) against the torch twin's rotation (`apply_rotary`), run by
Triton's interpreter on a CPU: fp32 in, the same q/k/v and input gradient to the bit. Where triton is not
installed (the CPU CI: CUDA builds of torch bring it) this skips; on a GPU, tests/models/test_qkv_rope_gpu.py
compares the compiled kernel with TE's."""

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


# (B, T, ng, g, hd; positions of the angles): rows not a multiple of the kernel's block; angles for more positions
@pytest.mark.parametrize("shape", [(2, 37, 3, 2, 16, 37), (1, 40, 2, 1, 8, 64)])
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
