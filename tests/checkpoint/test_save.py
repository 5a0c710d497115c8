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
    r = subprocess.run([sys.executable, "-m", "yxanul", "checkpoints", str(tmp_path / "x")], capture_output=True,
                       text=True)
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


# ---- manifest, verification, fallback (issue 17) ----------------------------------------------
from yxanul.checkpoint import latest_good_checkpoint, verified_weights_dir  # noqa: E402
from yxanul.checkpoint.manifest import verify_checkpoint  # noqa: E402


def _three(tmp_path, acc_model):
    acc, model, _ = acc_model
    for step in (1, 2, 3):
        with torch.no_grad():
            model.weight.add_(1.0)
        save_checkpoint(acc, tmp_path, _state(step), keep_last=5)
    return tmp_path / "checkpoints"


def test_manifest_lists_every_file_with_size_and_sha256(tmp_path, acc_model):
    import hashlib
    import json

    root = _three(tmp_path, acc_model)
    m = json.loads((root / "step_3" / "manifest.json").read_text())
    names = {p.name for p in (root / "step_3").iterdir()} - {"manifest.json"}
    assert set(m["files"]) == names and {"model.safetensors", "optimizer.bin", "trainer_state.json"} <= names
    for name, e in m["files"].items():
        data = (root / "step_3" / name).read_bytes()
        assert e["size"] == len(data) and e["sha256"] == hashlib.sha256(data).hexdigest()
    assert m["hash_seconds"] >= 0 and m["bytes"] == sum(e["size"] for e in m["files"].values())
    assert verify_checkpoint(root / "step_3") == []


def _flip_bit(p):
    b = bytearray(p.read_bytes())
    b[-3] ^= 0x10
    p.write_bytes(bytes(b))


DAMAGE = {  # name -> (how, a phrase of the problem)
    "flipped bit in the weights": (lambda d: _flip_bit(d / "model.safetensors"), "sha256"),
    "truncated weights": (lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:50]),
                          "model.safetensors has"),
    "empty weights": (lambda d: (d / "model.safetensors").write_bytes(b""), "model.safetensors has 0 bytes"),
    "weights missing": (lambda d: (d / "model.safetensors").unlink(), "model.safetensors missing"),
    "optimizer missing": (lambda d: (d / "optimizer.bin").unlink(), "optimizer.bin missing"),
    "optimizer truncated": (lambda d: (d / "optimizer.bin").write_bytes((d / "optimizer.bin").read_bytes()[:9]),
                            "optimizer.bin has"),
    "state not JSON": (lambda d: (d / "trainer_state.json").write_text("{oops"), "not JSON"),
    "state without data": (lambda d: (d / "trainer_state.json").write_text('{"step": 3}'), "no 'data'"),
    "garbage random states": (lambda d: next(d.glob("random_states_*.pkl")).write_bytes(b"garbage"),
                              "random_states_0.pkl"),
    "manifest garbage": (lambda d: (d / "manifest.json").write_text("[1, 2"), "manifest.json is not valid"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_damaged_latest_falls_back_to_the_newest_good_one(tmp_path, acc_model, case):
    root = _three(tmp_path, acc_model)
    how, phrase = DAMAGE[case]
    how(root / "step_3")
    problems = verify_checkpoint(root / "step_3")
    assert problems and phrase in "; ".join(problems), problems
    said = []
    assert resolve_resume("latest", tmp_path, say=said.append) == root / "step_2"
    assert len(said) == 1 and "step_3 is damaged" in said[0] and "resuming from step_2" in said[0], said
    with pytest.raises(UserError, match=r"resume '.*step_3': damaged checkpoint \("):  # named explicitly: no swap
        resolve_resume(str(root / "step_3"), tmp_path)
    with pytest.raises(UserError, match="init_from '.*step_3': damaged checkpoint"):
        verified_weights_dir(root / "step_3")
    assert "DAMAGED: " in format_table(tmp_path).splitlines()[3] and "ok" in format_table(tmp_path).splitlines()[2]


def test_none_verifies_is_one_line_and_pointers_stay_inside_the_run(tmp_path, acc_model):
    root = _three(tmp_path, acc_model)
    other = tmp_path / "other" / "checkpoints" / "step_9"
    other.mkdir(parents=True)
    for name in ("latest", "best"):
        for bad in (b"\x00\xff\xfe binary", b"../../other/checkpoints/step_9\n", str(other).encode()):
            (root / "latest").write_text("step_3\n")
            (root / name).write_bytes(bad)
            said = []
            assert latest_good_checkpoint(tmp_path, say=said.append) == root / "step_3"  # newest that verifies
            assert "pointer" in said[0] if name == "latest" else said == []
            assert "step_3" in format_table(tmp_path)
    for d in ("step_1", "step_2", "step_3"):
        (root / d / "model.safetensors").write_bytes(b"x")
    with pytest.raises(UserError, match=r"no checkpoint under .* verifies: step_3 is damaged .*; step_2 .*; step_1"):
        resolve_resume("latest", tmp_path, say=None)


def test_checkpoint_without_manifest_loads_with_a_note(tmp_path, acc_model):
    root = _three(tmp_path, acc_model)
    (root / "step_3" / "manifest.json").unlink()
    said = []
    assert resolve_resume("latest", tmp_path, say=said.append) == root / "step_3"
    assert len(said) == 1 and said[0].startswith("note: ") and "no manifest.json" in said[0]
    (root / "step_3" / "model.safetensors").write_bytes((root / "step_3" / "model.safetensors").read_bytes()[:-4])
    assert "model.safetensors is truncated" in "; ".join(verify_checkpoint(root / "step_3"))  # basic checks


def test_a_crash_while_pruning_never_lists_a_half_deleted_checkpoint(tmp_path, acc_model):
    acc, _, _ = acc_model
    for step in (1, 2):
        save_checkpoint(acc, tmp_path, _state(step), keep_last=1)

    def crash(stage):
        if stage == "in_prune":
            raise Crash(stage)

    with pytest.raises(Crash):
        save_checkpoint(acc, tmp_path, _state(3), keep_last=1, _fault=crash)
    root = tmp_path / "checkpoints"
    assert (root / ".del-step_2").is_dir()  # renamed first, then deleted: never listed as step_2
    assert [c["step"] for c in list_checkpoints(tmp_path)] == [3]
    assert all(verify_checkpoint(c["path"]) == [] for c in list_checkpoints(tmp_path))
    save_checkpoint(acc, tmp_path, _state(4), keep_last=1)
    assert not list(root.glob(".del-*")) and [c["step"] for c in list_checkpoints(tmp_path)] == [4]


def test_best_without_a_val_loss_never_crashes(tmp_path, acc_model):
    """`best` names a checkpoint re-saved without an eval (val_loss null): issue 17 item 2."""
    acc, _, _ = acc_model
    save_checkpoint(acc, tmp_path, _state(5, 3.0), keep_last=5)
    save_checkpoint(acc, tmp_path, _state(5, None), keep_last=5)  # re-saved after a resume, no eval
    save_checkpoint(acc, tmp_path, _state(10, 2.5), keep_last=1)
    assert (tmp_path / "checkpoints" / "best").read_text().strip() == "step_10"
    assert [c["step"] for c in list_checkpoints(tmp_path)] == [10]


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_disk_full_is_one_line_removes_the_partial_save_and_keeps_the_previous(tmp_path, acc_model):
    acc, before = _saved_then_changed(tmp_path, acc_model)

    def fill(d):  # a real ENOSPC from the kernel, inside the real save path
        with open("/dev/full", "wb") as f:
            f.write(b"x" * 4096)
            f.flush()

    with pytest.raises(UserError) as e:
        save_checkpoint(acc, tmp_path, _state(20), keep_last=3, extra=fill)
    msg = str(e.value)
    root = tmp_path / "checkpoints"
    assert msg.startswith("disk full: saving checkpoint step_20 into ") and str(root) in msg and "\n" not in msg
    assert "needs about " in msg and " bytes" in msg and "step_10 is intact" in msg
    assert not (root / ".tmp-step_20").exists() and [c["step"] for c in list_checkpoints(tmp_path)] == [10]
    assert (root / "step_10" / "model.safetensors").read_bytes() == before and verify_checkpoint(root / "step_10") == []


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
    with pytest.raises(UserError, match=r"written with fp8_weight_all_gather true, this run has false: the "
                                        r"optimizer state differs .*; resume with --fp8_weight_all_gather true$"):
        load_for_resume(acc, ckpt, parse_args(["--max_steps", "1000"]))
    assert all(not torch.equal(v, before[k]) for k, v in model.state_dict().items())  # nothing was loaded
    (ckpt / "config.yaml").write_text("model: nano\nfp8_weight_all_gather: false\n")
    load_for_resume(acc, ckpt, parse_args(["--max_steps", "1000"]))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
