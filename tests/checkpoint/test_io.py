"""`load_tolerant`, the one tolerant load behind a resume, ``--init_from`` and the checkpoint readers:
a tied head the save dropped is forgiven, any other missing or extra key is reported, and the callers turn
that into their one-line errors. `load_for_resume`, what ``--resume`` loads: TE's q/k/v views of one buffer
in place, no pickle that would run code, the checkpoint's own ``fp8_weight_all_gather``."""

import pytest
import torch
from _checkpoint import _state
from accelerate import Accelerator
from safetensors.torch import save_file

from yxanul.checkpoint import save_checkpoint
from yxanul.checkpoint.io import load_tolerant
from yxanul.checkpoint.manifest import verify_checkpoint
from yxanul.errors import EveryRankError, UserError
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


def test_a_fused_qkv_weight_saved_whole_is_read_under_the_qkv_names(tiny_config, tmp_path):
    """Saves that gather parameters by name (DeepSpeed's, which no state-dict hook sees) keep TE's fused QKV
    weight whole: `--init_from` and the checkpoint reader of export/eval/generate split it (GQA: k, v narrower)."""
    from yxanul.hub.loading import read_checkpoint_weights
    from yxanul.models.state_dict import fused_qkv_state

    model = YxanulForCausalLM(tiny_config(tie_word_embeddings=False, num_key_value_heads=2))
    state = model.state_dict()
    fused = fused_qkv_state(state)
    assert "model.layers.0.self_attention.layernorm_qkv.weight" in fused
    save_file({k: v.contiguous() for k, v in fused.items()}, str(tmp_path / "model.safetensors"))
    read = read_checkpoint_weights(tmp_path)
    assert set(read) == set(state) and all(torch.equal(read[k], v) for k, v in state.items())
    other = YxanulForCausalLM(tiny_config(tie_word_embeddings=False, num_key_value_heads=2))
    load_weights(other, str(tmp_path))
    assert all(torch.equal(other.state_dict()[k], v) for k, v in state.items())


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_sharded_weights_are_the_fp32_masters_where_the_optimizer_holds_them(tiny_config, tmp_path):
    """An FSDP2 checkpoint of ``fp8_weight_all_gather`` (layout of accelerate's save_state: ``model.<name>``
    in pytorch_model_fsdp_0/, ``optimizer.state.<name>.<key>`` in optimizer_0/): the model shards hold the
    TE weights FP8-rounded, the fused QKV weight unsplit, and TE's FusedAdam holds the fp32 masters. What
    export, eval and --init_from read: the masters for those weights, the model shards for the rest,
    under the q/k/v names (GQA: k and v narrower than q). FusedAdam keeps a master of the other parameters too,
    never stepped (fp32 parameters are stepped in place): those masters hold the first step's values, unread."""
    import torch
    import torch.distributed.checkpoint as dcp

    from yxanul.checkpoint.io import SHARDED_MODEL_DIR, SHARDED_OPTIMIZER_DIR
    from yxanul.hub.loading import read_checkpoint_weights
    from yxanul.models.state_dict import fused_qkv_state

    state = YxanulForCausalLM(tiny_config(tie_word_embeddings=False, num_key_value_heads=2)).state_dict()
    fused = fused_qkv_state(state)  # the names of the model the trainer holds (one QKV weight per layer)
    assert set(fused) != set(state)
    fp8 = [k for k in fused if k.endswith(("layernorm_qkv.weight", "fc1_weight", "fc2_weight", "proj.weight"))]
    rounded = {k: v.to(torch.float8_e4m3fn).float() if k in fp8 else v.clone() for k, v in fused.items()}
    assert all(not torch.equal(rounded[k], fused[k]) for k in fp8)
    stale = {k: torch.randn_like(v) for k, v in fused.items() if k not in fp8 and v.is_floating_point()}
    opt = {"state": {k: {"exp_avg": torch.zeros_like(fused[k]), "master_param": fused[k].clone() if k in fp8
                         else stale[k]} for k in [*fp8, *stale]},
           "param_groups": [{"lr": 1e-3, "params": [*fp8, *stale]}]}
    dcp.save({"model": rounded}, checkpoint_id=tmp_path / SHARDED_MODEL_DIR, no_dist=True)
    dcp.save({"optimizer": opt}, checkpoint_id=tmp_path / SHARDED_OPTIMIZER_DIR, no_dist=True)

    weights = read_checkpoint_weights(tmp_path)  # what export, eval and generate read
    assert set(weights) == set(state)
    assert all(torch.equal(weights[k], state[k]) for k in state)  # masters where FP8, the shards elsewhere


def _fused_qkv_twin(config):
    """The torch twin with TE's fused QKV layout and hooks (``fuse_qkv_params``): each ``layernorm_qkv`` holds
    ONE ``weight`` = cat[q, k, v] (models/modeling_te.py registers the same two hooks on TE's module)."""
    from torch import nn

    from yxanul.models.state_dict import fuse_split_qkv, split_fused_qkv

    model = YxanulForCausalLM(config)
    kv = config.num_key_value_heads * config.head_dim
    for layer in model.model.layers:
        twin = layer.self_attention.layernorm_qkv
        fused = nn.Module()
        fused.layer_norm_weight = nn.Parameter(twin.layer_norm_weight.detach().clone())
        fused.weight = nn.Parameter(torch.cat([twin.query_weight, twin.key_weight, twin.value_weight]).detach())
        fused.register_state_dict_post_hook(split_fused_qkv((config.hidden_size, kv, kv)))
        fused.register_load_state_dict_pre_hook(fuse_split_qkv)
        layer.self_attention.layernorm_qkv = fused
    return model


@pytest.mark.filterwarnings("ignore:.*(torch.distributed|FSDP|fully_shard|DTensor).*")
def test_an_fsdp2_model_with_fused_qkv_saves_resumes_and_reads_back_under_the_qkv_names(tiny_config, tmp_path):
    """FSDP2 + ``fuse_qkv_params`` (one gloo process on the CPU, torch's own fully_shard and DCP state-dict
    calls, as accelerate's save_state/load_state make them): the sharded fused weight stays fused in the
    state dict (DCP resolves each key to an attribute; the q/k/v names are none), a fresh sharded model
    loads it back, and the checkpoint's reader splits it into the q/k/v of the unsharded model."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from yxanul.checkpoint.io import SHARDED_MODEL_DIR
    from yxanul.hub.loading import read_checkpoint_weights

    config = tiny_config(tie_word_embeddings=False, num_key_value_heads=2)
    torch.manual_seed(0)
    plain = _fused_qkv_twin(config)
    expected = plain.state_dict()                                 # unsharded: the q/k/v names
    assert any(k.endswith("layernorm_qkv.query_weight") for k in expected)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))

        def sharded(seed):
            torch.manual_seed(seed)
            model = _fused_qkv_twin(config)
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh)
            return fully_shard(model, mesh=mesh)

        model = sharded(0)
        state = get_model_state_dict(model)
        fused = [k for k in state if k.endswith("layernorm_qkv.weight")]
        assert len(fused) == config.num_hidden_layers and isinstance(state[fused[0]], DTensor)
        dcp.save({"model": state}, checkpoint_id=tmp_path / SHARDED_MODEL_DIR)

        other = sharded(1)
        assert not torch.equal(other.state_dict()[fused[0]].full_tensor(), state[fused[0]].full_tensor())
        restored = get_model_state_dict(other)
        dcp.load({"model": restored}, checkpoint_id=tmp_path / SHARDED_MODEL_DIR)
        set_model_state_dict(other, restored)
        assert all(torch.equal(v.full_tensor(), state[k].full_tensor()) for k, v in other.state_dict().items())
    finally:
        dist.destroy_process_group()

    weights = read_checkpoint_weights(tmp_path)  # what export, eval and generate read
    assert set(weights) == set(expected)
    assert all(torch.equal(weights[k], v) for k, v in expected.items())


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


def _fuse_qkv_like_te(model):
    """Make every layer's query/key/value weights views of ONE buffer, as TE's LayerNormLinear
    (parameters_split) registers them: the storage layout that accelerate's own load_state refuses."""
    for layer in model.model.layers:
        qkv = layer.self_attention.layernorm_qkv
        parts = [qkv.query_weight, qkv.key_weight, qkv.value_weight]
        buf = torch.cat([p.detach() for p in parts])
        start = 0
        for name, p in zip(("query_weight", "key_weight", "value_weight"), parts):
            setattr(qkv, name, torch.nn.Parameter(buf[start:start + p.shape[0]]))
            start += p.shape[0]


def test_resume_loads_weights_that_are_views_of_one_buffer(tmp_path, tiny_config):
    """A TE model's q/k/v weights share one storage; accelerate's load_state (safetensors.load_model)
    raised "None is covering the entire storage" on every TE checkpoint. load_for_resume loads them
    in place, the tied head included, and still refuses weights of another shape."""
    from safetensors.torch import load_model

    from yxanul.checkpoint import load_for_resume
    from yxanul.config import parse_args
    from yxanul.models import YxanulForCausalLM

    def build(**kw):
        torch.manual_seed(0)
        model = YxanulForCausalLM(tiny_config(**kw))
        _fuse_qkv_like_te(model)
        acc = Accelerator(cpu=True)
        opt = torch.optim.AdamW(model.parameters())
        return acc, *acc.prepare(model, opt)

    acc, model, opt = build()
    qkv = model.model.layers[0].self_attention.layernorm_qkv
    assert qkv.key_weight.untyped_storage().data_ptr() == qkv.query_weight.untyped_storage().data_ptr()
    model(torch.randint(0, 1000, (2, 16)), labels=torch.randint(0, 1000, (2, 16))).loss.backward()
    opt.step()
    save_checkpoint(acc, tmp_path, _state(3), keep_last=3)
    ckpt = tmp_path / "checkpoints" / "step_3"
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    saved_opt = {i: {k: v.clone() for k, v in st.items()} for i, st in opt.state_dict()["state"].items()}
    with pytest.raises(RuntimeError, match="entire storage"):  # what plain accelerate does with it
        load_model(model, ckpt / "model.safetensors")
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    opt.optimizer.state.clear()  # a fresh optimizer: only the load can bring its moments back
    cfg = parse_args(["--model", "nano"])
    load_for_resume(acc, ckpt, cfg)
    for k, v in model.state_dict().items():
        assert torch.equal(v, saved[k]), k
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
    restored = opt.state_dict()["state"]
    assert restored.keys() == saved_opt.keys() and saved_opt, "optimizer state restored too"
    assert all(torch.equal(restored[i][k], v) for i, st in saved_opt.items() for k, v in st.items())
    assert qkv.key_weight.untyped_storage().data_ptr() == qkv.query_weight.untyped_storage().data_ptr()

    other, _, _ = build(intermediate_size=768)
    with pytest.raises(UserError, match=r"resume '.*step_3': its weights do not fit this model \(.*size mismatch"):
        load_for_resume(other, ckpt, cfg)
    # a checkpoint of another engine's layout: accelerate would look for files that are not there, per rank
    for folder, name in (("pytorch_model_fsdp_0", "FSDP2 \\(sharded\\)"), ("pytorch_model", "DeepSpeed")):
        (ckpt / folder).mkdir()
        with pytest.raises(EveryRankError, match=f"written under {name}, this launch is a single process or DDP: "
                                                 "relaunch"):  # every rank finds it: rank 0 alone prints it
            load_for_resume(acc, ckpt, cfg)
        (ckpt / folder).rmdir()


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("name", ["optimizer.bin", "random_states_0.pkl"])
def test_every_file_resume_unpickles_refuses_a_code_pickle(tmp_path, acc_model, name):
    """load_for_resume (what `--resume` runs) on a checkpoint whose manifest was rewritten to match."""
    from yxanul.checkpoint import load_for_resume
    from yxanul.checkpoint.manifest import write_manifest
    from yxanul.config import parse_args

    acc, _, _ = acc_model
    ckpt = save_checkpoint(acc, tmp_path, _state(1), keep_last=2)
    marker = tmp_path / "pwned"
    torch.save({"state": _Payload(marker), "param_groups": []}, ckpt / name)
    write_manifest(ckpt, lambda p, text: p.write_text(text))
    assert verify_checkpoint(ckpt) == []
    with pytest.raises(UserError, match="holds a pickle that would run code; refused, nothing was executed"):
        load_for_resume(acc, ckpt, parse_args(["--max_steps", "1000"]))
    assert not marker.exists()
    (ckpt / "random_states_0.pkl").write_bytes(b"garbage")  # accelerate swallows this one silently
    with pytest.raises(UserError, match="random_states_0.pkl is unreadable|not a readable torch file"):
        load_for_resume(acc, ckpt, parse_args(["--max_steps", "1000"]))


def test_resume_keeps_the_checkpoints_fp8_weight_all_gather(tmp_path, acc_model):
    """The setting decides the optimizer (TE's FusedAdam with fp32 masters, else AdamW) and what the model
    shards hold: a resume with the other value is one line, before anything is loaded."""
    from yxanul.checkpoint import load_for_resume
    from yxanul.config import parse_args

    acc, model, _ = acc_model
    ckpt = save_checkpoint(acc, tmp_path, _state(1), keep_last=2)
    (ckpt / "config.yaml").write_text("model: nano\nfp8_weight_all_gather: true\n")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    with pytest.raises(EveryRankError, match=r"written with fp8_weight_all_gather true, this run has false: the "
                                             r"optimizer state differs .*; resume with --fp8_weight_all_gather true$"):
        load_for_resume(acc, ckpt, parse_args(["--max_steps", "1000"]))
    assert all(not torch.equal(v, before[k]) for k, v in model.state_dict().items())  # nothing was loaded
    (ckpt / "config.yaml").write_text("model: nano\nfp8_weight_all_gather: false\n")
    load_for_resume(acc, ckpt, parse_args(["--max_steps", "1000"]))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
