"""The activation formula against what autograd really saves (saved_tensors_hooks), on small models."""

import pytest
import torch

from yxanul.models import YxanulConfig, YxanulForCausalLM
from yxanul.models.configuration_yxanul import matmul_parameters
from yxanul.planning.activations import activations, measure_saved

SHAPES = {
    "gqa": dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=704, vocab_size=1024),
    "mha-3-layers": dict(hidden_size=192, num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=3,
                         intermediate_size=512, vocab_size=640),
}
LOSS_SCALAR = 4  # the fp32 loss itself, saved by the final division (the chunked loss saves none)


@pytest.mark.parametrize("loss_impl", ["default", "chunked"])
@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("micro,seq", [(1, 48), (3, 32)])
def test_formula_equals_the_saved_tensors_of_a_real_bf16_step(name, micro, seq, loss_impl):
    torch.manual_seed(0)
    c = YxanulConfig(**SHAPES[name], backend="torch", loss_impl=loss_impl)
    got = measure_saved(YxanulForCausalLM(c), micro, seq, torch.bfloat16)
    chunked = loss_impl == "chunked"
    head = c.vocab_size * c.hidden_size if chunked else 0  # the chunked loss keeps no bf16 copy of the head
    casts = 2 * (matmul_parameters(c) - head)  # autocast's bf16 weight copies, saved for backward
    saved = activations(c, micro, seq, loss_impl=loss_impl).saved
    assert got["bytes"] == saved + casts + (0 if chunked else LOSS_SCALAR)


@pytest.mark.parametrize("micro,seq", [(1, 48), (3, 32)])
def test_checkpointing_formula_equals_the_saved_tensors_of_a_real_bf16_step(micro, seq):
    """Activation checkpointing: autograd keeps each layer's input (the first the fp32 embedding, then bf16), and
    outside the layers what the formula counts there; besides, the LM head's bf16 weight copy (autocast's, outside
    the checkpointed layers), the RoPE table (one T x head_dim fp32 checkpoint input) and the loss scalar."""
    torch.manual_seed(0)
    c = YxanulConfig(**SHAPES["mha-3-layers"], backend="torch")
    model = YxanulForCausalLM(c).train()
    model.set_activation_checkpointing(True)
    got = measure_saved(model, micro, seq, torch.bfloat16)
    extra = 2 * c.vocab_size * c.hidden_size + seq * c.head_dim * 4 + LOSS_SCALAR
    assert got["bytes"] == activations(c, micro, seq, checkpointing=True).saved + extra


def test_checkpointing_keeps_only_the_layer_inputs():
    c = YxanulConfig(**SHAPES["gqa"], backend="torch")
    full, ckpt = activations(c, 2, 64), activations(c, 2, 64, checkpointing=True)
    assert ckpt.saved < full.saved and ckpt.recompute > 0 and full.recompute == 0
    assert full.saved - ckpt.saved > (c.num_hidden_layers - 1) * 20 * c.hidden_size * 2 * 64
