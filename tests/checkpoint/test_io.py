"""`load_tolerant`, the one tolerant load behind a resume, ``--init_from`` and the checkpoint readers:
a tied head the save dropped is forgiven, any other missing or extra key is reported, and the callers turn
that into their one-line errors."""

import pytest
from safetensors.torch import save_file

from yxanul.checkpoint.io import load_tolerant
from yxanul.errors import UserError
from yxanul.models import YxanulForCausalLM
from yxanul.models.build import load_weights


def test_only_an_aliased_tied_head_is_forgiven(tiny_config):
    tied = YxanulForCausalLM(tiny_config())
    state = {k: v.clone() for k, v in tied.state_dict().items() if k != "lm_head.weight"}
    assert load_tolerant(tied, state) == ([], [])  # the head IS the embedding: nothing missing

    untied = YxanulForCausalLM(tiny_config(tie_word_embeddings=False))
    state = {k: v.clone() for k, v in untied.state_dict().items() if k != "lm_head.weight"}
    assert load_tolerant(untied, state) == (["lm_head.weight"], [])

    state = {k: v.clone() for k, v in tied.state_dict().items() if k != "model.norm.weight"}
    state["model.extra.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = load_tolerant(tied, state)
    assert missing == ["model.norm.weight"] and unexpected == ["model.extra.weight"]


def test_init_from_a_folder_missing_a_weight_is_one_line(tiny_config, tmp_path):
    model = YxanulForCausalLM(tiny_config())
    state = {k: v.clone().contiguous() for k, v in model.state_dict().items()
             if k not in ("lm_head.weight", "model.layers.0.self_attention.proj.weight")}
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(UserError, match=r"weights do not match the model \(missing \['model\.layers\.0\."):
        load_weights(YxanulForCausalLM(tiny_config()), str(tmp_path))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_sharded_weights_are_the_fp32_masters_where_the_optimizer_holds_them(tiny_config, tmp_path):
    """An FSDP2 checkpoint of ``fp8_weight_all_gather`` (layout of accelerate's save_state: ``model.<name>``
    in pytorch_model_fsdp_0/, ``optimizer.state.<name>.<key>`` in optimizer_0/): the model shards hold the
    TE weights FP8-rounded, the fused QKV weight unsplit, and TE's FusedAdam holds the fp32 masters. What
    export, eval and --init_from read: the masters for those weights, the model shards for the rest,
    under the q/k/v names (GQA: k and v narrower than q)."""
    import torch
    import torch.distributed.checkpoint as dcp

    from yxanul.checkpoint.io import SHARDED_MODEL_DIR, SHARDED_OPTIMIZER_DIR, read_sharded_weights
    from yxanul.models.state_dict import fused_qkv_state

    state = YxanulForCausalLM(tiny_config(tie_word_embeddings=False, num_key_value_heads=2)).state_dict()
    fused = fused_qkv_state(state)  # the names of the model the trainer holds (one QKV weight per layer)
    assert set(fused) != set(state)
    fp8 = [k for k in fused if k.endswith(("layernorm_qkv.weight", "fc1_weight", "fc2_weight", "proj.weight"))]
    rounded = {k: v.to(torch.float8_e4m3fn).float() if k in fp8 else v.clone() for k, v in fused.items()}
    assert all(not torch.equal(rounded[k], fused[k]) for k in fp8)
    opt = {"state": {k: {"exp_avg": torch.zeros_like(fused[k]), "master_param": fused[k].clone()} for k in fp8},
           "param_groups": [{"lr": 1e-3, "params": fp8}]}
    dcp.save({"model": rounded}, checkpoint_id=tmp_path / SHARDED_MODEL_DIR, no_dist=True)
    dcp.save({"optimizer": opt}, checkpoint_id=tmp_path / SHARDED_OPTIMIZER_DIR, no_dist=True)

    weights = read_sharded_weights(tmp_path)
    assert set(weights) == set(state)
    assert all(torch.equal(weights[k], state[k]) for k in state)  # masters where FP8, the shards elsewhere


@pytest.mark.te
def test_a_missing_fp8_weight_is_reported_though_fp8_weights_share_data_ptr_0():
    """TE's FP8 weights (Float8Tensor, a wrapper tensor subclass; built here on the CPU, no kernel needed)
    all report data_ptr() 0, so to the alias check of `load_tolerant` every one looked like a tied copy of
    any other that was loaded: a checkpoint missing one of them was forgiven."""
    import torch
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.float8_tensor import Float8Tensor

    def fp8():
        return torch.nn.Parameter(Float8Tensor(
            shape=(4, 4), dtype=torch.float32, data=torch.randint(0, 100, (4, 4), dtype=torch.uint8),
            fp8_scale_inv=torch.ones(1), fp8_dtype=tex.DType.kFloat8E4M3, quantizer=None, requires_grad=False,
            device=torch.device("cpu")), requires_grad=False)

    model = torch.nn.Module()
    model.a, model.b, model.norm = fp8(), fp8(), torch.nn.Parameter(torch.ones(4))
    assert model.a.data_ptr() == model.b.data_ptr() == 0
    state = {k: v for k, v in model.state_dict().items() if k != "b"}
    assert load_tolerant(model, state) == (["b"], [])
