"""Atomic checkpoints, pointers, pruning and the listing table (real accelerate save_state)."""

import subprocess
import sys

import pytest
import torch
from accelerate import Accelerator

from yxanul.checkpoint import format_table, list_checkpoints, resolve_resume, save_checkpoint
from yxanul.errors import UserError


class Crash(Exception):
    pass


@pytest.fixture
def acc_model():
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    model, opt = acc.prepare(model, opt)
    return acc, model, opt


def _state(step, val=None):
    return {"step": step, "tokens_seen": step * 100, "data": {"position": step}, "val_loss": val,
            "precision": "FP32", "backend": "torch"}


def _saved_then_changed(tmp_path, acc_model):
    """Save step 10, then change the weights; returns the accelerator and step 10's weight bytes."""
    acc, model, _ = acc_model
    save_checkpoint(acc, tmp_path, _state(10), keep_last=3)
    before = (tmp_path / "checkpoints" / "step_10" / "model.safetensors").read_bytes()
    with torch.no_grad():
        model.weight.add_(1.0)
    return acc, before


def test_crash_mid_save_keeps_previous(tmp_path, acc_model):
    acc, before = _saved_then_changed(tmp_path, acc_model)

    def crash(stage):
        raise Crash(stage)

    with pytest.raises(Crash):
        save_checkpoint(acc, tmp_path, _state(20), keep_last=3, _fault=crash)
    # the half-written save is not a checkpoint; latest still points to the intact one
    assert [c["step"] for c in list_checkpoints(tmp_path)] == [10]
    assert resolve_resume("latest", tmp_path).name == "step_10"
    assert (tmp_path / "checkpoints" / "step_10" / "model.safetensors").read_bytes() == before
    assert (tmp_path / "checkpoints" / ".tmp-step_20").exists()
    # the next save cleans up the leftovers
    save_checkpoint(acc, tmp_path, _state(30), keep_last=3)
    assert not (tmp_path / "checkpoints" / ".tmp-step_20").exists()
    assert resolve_resume("latest", tmp_path).name == "step_30"


def test_crash_while_replacing_a_step_keeps_the_old_copy(tmp_path, acc_model):
    """Re-saving an existing step (training again from an older checkpoint): the old copy is moved
    aside, never deleted before the new one is in place; a crash in between leaves it resumable."""
    acc, before = _saved_then_changed(tmp_path, acc_model)

    def crash(stage):
        if stage == "after_swap":
            raise Crash(stage)

    with pytest.raises(Crash):
        save_checkpoint(acc, tmp_path, _state(10), keep_last=3, _fault=crash)
    assert [c["step"] for c in list_checkpoints(tmp_path)] == [10]
    old = resolve_resume("latest", tmp_path)
    assert old.name == ".old-step_10" and (old / "model.safetensors").read_bytes() == before
    save_checkpoint(acc, tmp_path, _state(20), keep_last=3)  # the next save puts it back
    assert [c["path"].rsplit("/", 1)[1] for c in list_checkpoints(tmp_path)] == ["step_10", "step_20"]
    assert (tmp_path / "checkpoints" / "step_10" / "model.safetensors").read_bytes() == before
    save_checkpoint(acc, tmp_path, _state(10), keep_last=3)  # a clean replace leaves no .old-*
    assert not list((tmp_path / "checkpoints").glob(".old-*"))
    assert (tmp_path / "checkpoints" / "step_10" / "model.safetensors").read_bytes() != before


def test_keep_last_and_best(tmp_path, acc_model):
    acc, _, _ = acc_model
    for step, val in [(1, 3.0), (2, 1.0), (3, 2.0), (4, 2.5), (5, 2.6)]:
        save_checkpoint(acc, tmp_path, _state(step, val), keep_last=2)
    steps = [c["step"] for c in list_checkpoints(tmp_path)]
    assert steps == [2, 4, 5]  # last two + best (val 1.0)
    table = format_table(tmp_path)
    assert "best" in table.splitlines()[1] and "latest" in table.splitlines()[-1]


def test_resume_errors(tmp_path):
    assert resolve_resume("latest", tmp_path) is None
    with pytest.raises(UserError, match="not a checkpoint"):
        resolve_resume(str(tmp_path / "nothing"), tmp_path)


def test_checkpoints_cli(tmp_path, acc_model):
    acc, _, _ = acc_model
    save_checkpoint(acc, tmp_path, _state(7, 2.0), keep_last=2)
    r = subprocess.run([sys.executable, "-m", "yxanul", "checkpoints", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0 and "step_7" in r.stdout
    r = subprocess.run([sys.executable, "-m", "yxanul", "checkpoints", str(tmp_path / "x")], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error: run directory")


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
    cfg = parse_args(["--model", "tiny"])
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
