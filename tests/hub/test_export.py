"""`yxanul export`: the Llama folder loads in plain transformers (a subprocess where importing yxanul is
impossible, no trust_remote_code) and gives the yxanul model's fp32 logits (<= 1e-5) and greedy tokens;
from accelerate checkpoints with TE's fused q/k/v views and FP8 extra state; round trip through --init_from."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file
from tiny_run import ds_train

from hub.helpers import PRESET, random_model, save_run
from yxanul.cli import main as cli
from yxanul.hub.export import export
from yxanul.models import YxanulForCausalLM

IDS = [[5, 17, 300, 999, 42, 7, 7, 128, 64, 900, 3, 1]]

# Runs WITHOUT yxanul (any import of it fails) and without trust_remote_code.
PLAIN = textwrap.dedent("""
    import json, sys, torch
    sys.modules["yxanul"] = None
    from transformers import AutoModelForCausalLM, LlamaForCausalLM
    out = {}
    for d in json.loads(sys.argv[1]):
        m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        assert type(m) is LlamaForCausalLM, type(m)
        ids = torch.tensor(json.loads(sys.argv[2]))
        with torch.no_grad():
            logits = m(ids).logits
            greedy = m.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
        torch.save({"logits": logits, "greedy": greedy}, d + "/plain.pt")
""")


SHAPES = [(2, False, 1000), (4, True, 1024), (1, False, 1030)]  # GQA untied V%64!=0; MHA tied; MQA untied


def test_the_llama_config_carries_the_checkpoints_heads_and_tie(tmp_path):
    """The fast half of the plain-transformers test below (slow): the exported config.json has the checkpoint's
    KV heads (read off its weights) and tie, so the weights load into the right shapes."""
    for kv, tied, vocab in SHAPES:
        model = random_model(kv, tied, vocab)
        save_run(model, tmp_path / f"r{kv}")
        out = export(tmp_path / f"r{kv}", tmp_path / f"l{kv}", dtype="fp32")
        cfg = json.loads((out / "config.json").read_text())
        assert (cfg["num_key_value_heads"], cfg["tie_word_embeddings"], cfg["vocab_size"]) == (kv, tied, vocab)
        assert cfg["rope_parameters"]["rope_theta"] == model.config.rope_theta


@pytest.mark.slow  # ~20-60 s on 2 busy cores: a subprocess importing transformers, 3 models
def test_llama_export_matches_yxanul_in_plain_transformers(tmp_path):
    ids = torch.tensor(IDS)
    dirs, ours = [], {}
    for kv, tied, vocab in SHAPES:
        name = f"kv{kv}-tied{tied}-v{vocab}"
        model = random_model(kv, tied, vocab)
        with torch.no_grad():
            ours[name] = (model(ids).logits, model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0))
        save_run(model, tmp_path / name)
        out = export(tmp_path / name, tmp_path / f"{name}-llama", dtype="fp32")
        dirs.append(str(out))
        sd = load_file(str(out / "model.safetensors"))
        assert ("lm_head.weight" in sd) is (not tied)
        assert sd["model.layers.0.self_attn.k_proj.weight"].shape[0] == kv * 64
    r = subprocess.run([sys.executable, "-c", PLAIN, json.dumps(dirs), json.dumps(IDS)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    for d, (name, (logits, greedy)) in zip(dirs, ours.items()):
        plain = torch.load(f"{d}/plain.pt")
        assert (plain["logits"] - logits).abs().max().item() <= 1e-5, name
        assert torch.equal(plain["greedy"], greedy), name


@pytest.mark.slow
def test_export_round_trips_into_yxanul_and_yxanul_format_loads(tmp_path):
    from transformers import AutoModelForCausalLM

    from yxanul.models.args import ModelArgs
    from yxanul.models.build import build_model

    model = random_model(2, False, 1024, seed=1)
    save_run(model, tmp_path / "run", te_views=False)
    llama = export(tmp_path / "run", tmp_path / "llama", dtype="fp32", max_shard_size="2MB")
    assert (llama / "model.safetensors.index.json").is_file() and len(list(llama.glob("model-*.safetensors"))) > 1
    back = build_model(ModelArgs(model=PRESET, backend="torch", seq_length=64, tie_word_embeddings=False,
                                 init_from=str(llama)), vocab_size=1024)
    for k, v in model.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    yx = export(tmp_path / "run", tmp_path / "yx", fmt="yxanul", dtype="fp32")
    loaded = AutoModelForCausalLM.from_pretrained(str(yx)).eval()
    assert type(loaded) is YxanulForCausalLM
    ids = torch.tensor(IDS)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    cfg = json.loads((yx / "config.json").read_text())
    (yx / "config.json").write_text(json.dumps(dict(cfg, backend="te")))  # as saved from a TE model
    script = ("import torch, sys; from yxanul.hub.loading import load_model; m, _ = load_model(sys.argv[1]); "
              "print(m.config.backend, m(torch.tensor([[5, 17, 300]])).logits.sum().item())")
    r = subprocess.run([sys.executable, "-c", script, str(yx)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]  # a fresh process: the yxanul type registers itself, TE -> torch
    backend, total = r.stdout.split()[-2:]
    with torch.no_grad():
        want = model(torch.tensor([[5, 17, 300]])).logits.sum().item()
    assert backend == "torch" and float(total) == pytest.approx(want, abs=1e-3)
    again = export(yx, tmp_path / "from-export", dtype="bf16")  # an export is a valid source too
    sd = load_file(str(again / "model.safetensors"))
    assert sd["model.norm.weight"].dtype == torch.bfloat16
    assert json.loads((again / "config.json").read_text())["dtype"] == "bfloat16"


def test_export_picks_best_and_user_errors_are_one_line(tmp_path, capsys, monkeypatch):
    model = random_model(2, True, 1024)
    save_run(model, tmp_path / "run", te_views=False, step=2)
    (tmp_path / "run" / "checkpoints" / "best").write_text("step_2\n")
    assert cli(["export", str(tmp_path / "run"), str(tmp_path / "o")]) == 0
    assert "exported" in capsys.readouterr().out
    assert cli(["export", str(tmp_path / "run"), str(tmp_path / "o")]) == 2  # not empty
    assert cli(["export", str(tmp_path / "nope"), str(tmp_path / "o2")]) == 2
    assert cli(["export", str(tmp_path / "run"), str(tmp_path / "o3"), "--format", "gguf"]) == 2
    assert cli(["export", str(tmp_path / "run"), str(tmp_path), "--overwrite"]) == 2  # would delete the run
    assert (tmp_path / "run" / "checkpoints" / "step_2" / "model.safetensors").is_file()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(line.startswith("error: ") for line in err), err
    assert "no such file" in err[1] and "gguf" in err[2]
    before = {f.name: f.read_bytes() for f in (tmp_path / "o").iterdir()}
    assert cli(["export", str(tmp_path / "run"), str(tmp_path / "o"), "--overwrite", "--max_shard_size", "2G"]) == 2
    assert "'max_shard_size': expected a size such as 5GB" in capsys.readouterr().err

    def full_disk(*_):  # the last files of an export (the model card): a failure after the weights
        raise OSError(28, "No space left on device")
    monkeypatch.setattr("yxanul.hub.export.write_run_files", full_disk)
    with pytest.raises(OSError, match="No space left"):
        export(str(tmp_path / "run"), tmp_path / "o", overwrite=True)
    assert {f.name: f.read_bytes() for f in (tmp_path / "o").iterdir()} == before  # the previous export, whole
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".o.")] == []


def test_export_never_overwrites_the_run_it_exports(tmp_path, capsys):
    """--overwrite replaces OUT whole: OUT = the exported checkpoint, the checkpoints folder, another checkpoint
    or a run folder that holds files is one line, exit 2, and every checkpoint still verifies byte for byte;
    a new folder in the run, and an earlier export there with --overwrite, are fine."""
    from yxanul.checkpoint import verify_checkpoint
    from yxanul.hub.loading import resolve_checkpoint

    run = tmp_path / "run"
    for step in (2, 4):
        save_run(random_model(2, True, 1024), run, te_views=False, step=step)
    (run / "checkpoints" / "best").write_text("step_4\n")
    (run / "logs").mkdir()
    (run / "logs" / "events").write_text("x")
    ckpts = run / "checkpoints"
    before = {f: f.read_bytes() for f in run.rglob("*") if f.is_file()}
    assert resolve_checkpoint(run) == ckpts / "step_4"
    refused = [(run, ckpts / "step_4"), (run, ckpts), (run, ckpts / "step_2"), (ckpts / "step_4", ckpts / "step_2"),
               (ckpts / "step_2", ckpts / "step_2" / "sub"), (run, run / "logs")]
    for source, out in refused:
        assert cli(["export", str(source), str(out), "--overwrite"]) == 2, (source, out)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: export OUT '{out}': "), err
    assert {f: f.read_bytes() for f in run.rglob("*") if f.is_file()} == before
    assert verify_checkpoint(ckpts / "step_2") == verify_checkpoint(ckpts / "step_4") == []
    assert cli(["export", str(run), str(run / "hf")]) == 0
    assert cli(["export", str(run), str(run / "hf"), "--overwrite"]) == 0  # an earlier export: what it is for
    assert (run / "hf" / "config.json").is_file() and not (ckpts / "step_4" / "config.json").exists()
    other = tmp_path / "other"  # another run's directory is no export folder either
    save_run(random_model(2, True, 1024), other, te_views=False, step=2)
    assert cli(["export", str(run), str(other), "--overwrite"]) == 2
    assert "a run directory" in capsys.readouterr().err and verify_checkpoint(other / "checkpoints" / "step_2") == []
    hf = tmp_path / "hf_trainer_out"  # a transformers.Trainer output_dir: config.json on top, checkpoint-N below
    (hf / "checkpoint-4").mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    (hf / "checkpoint-4" / "trainer_state.json").write_text('{"global_step": 4}')
    (hf / "checkpoint-4" / "optimizer.pt").write_bytes(b"moments")
    assert cli(["export", str(run), str(hf), "--overwrite"]) == 2
    assert "a transformers Trainer output" in capsys.readouterr().err
    assert (hf / "checkpoint-4" / "optimizer.pt").read_bytes() == b"moments"


@pytest.mark.slow
def test_export_from_deepspeed_zero1_checkpoint(tmp_path):
    """A real ZeRO-1 run (one process, CPU) leaves DeepSpeed's pytorch_model/ folder; the export equals
    the same run's plain-accelerate weights as DeepSpeed's zero_to_fp32 rebuilds them."""
    pytest.importorskip("deepspeed")
    from yxanul.hub.loading import load_checkpoint_model, resolve_checkpoint

    ds_train("--max_steps", "2", "--warmup_steps", "1", "--checkpoint_freq", "2", "--output_dir", str(tmp_path / "ds"))
    ckpt = resolve_checkpoint(tmp_path / "ds")
    assert (ckpt / "pytorch_model").is_dir() and not list(ckpt.glob("model*.safetensors"))
    out = export(tmp_path / "ds", tmp_path / "llama", dtype="fp32")
    sd = load_file(str(out / "model.safetensors"))
    ref = load_checkpoint_model(ckpt).state_dict()
    assert torch.equal(sd["model.layers.0.mlp.down_proj.weight"], ref["model.layers.0.layernorm_mlp.fc2_weight"])
    assert sd["model.embed_tokens.weight"].std() > 0


def test_the_exported_tokenizer_truncates_where_the_models_positions_end(tmp_path, tok_run):
    """Not tokenizers' 1e30 placeholder: `truncation=True` gives at most max_position_embeddings tokens."""
    from transformers import AutoTokenizer

    out = export(tok_run[0], tmp_path / "llama")
    tok, positions = AutoTokenizer.from_pretrained(str(out)), json.loads((out / "config.json").read_text())
    assert tok.model_max_length == positions["max_position_embeddings"]
    assert len(tok("ROMEO: " * 500, truncation=True).input_ids) == positions["max_position_embeddings"]


@pytest.mark.slow
def test_real_run_exports_with_tokenizer_and_card(tmp_path, monkeypatch):
    """`yxanul train` (a few steps, bundled data) -> `yxanul export` finds the run's tokenizer through its
    config.yaml; plain transformers generates from the folder; the card has the run's numbers."""
    monkeypatch.setenv("YXANUL_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    assert cli(["train", "--model", PRESET, "--max_steps", "3", "--warmup_steps", "1", "--checkpoint_freq", "3",
                "--eval_freq", "3",
                "--eval_steps", "1", "--sample_tokens", "0", "--use_tensorboard", "false", "--num_workers", "0",
                "--seq_length", "32", "--micro_batch_size", "2", "--max_documents", "60", "--val_fraction", "0.1",
                "--output_dir", str(run)]) == 0
    out = export(run, tmp_path / "llama")
    names = {p.name for p in out.iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json", "README.md", "loss_curve.png", "metrics.jsonl"} <= names
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert modes["model.safetensors"] == modes["config.json"] == modes["tokenizer.json"], modes  # not 0600
    assert "local_files_only" not in json.loads((out / "tokenizer_config.json").read_text())
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok, m = AutoTokenizer.from_pretrained(str(out)), AutoModelForCausalLM.from_pretrained(str(out))
    assert m.config.vocab_size == 8192 and m.dtype == torch.bfloat16
    ids = tok("ROMEO:", return_tensors="pt").input_ids
    assert m.generate(ids, max_new_tokens=4, do_sample=False).shape[1] == ids.shape[1] + 4
    assert tok.model_max_length == m.config.max_position_embeddings  # truncation=True stops where positions end
    assert len(tok("x " * 500, truncation=True).input_ids) == m.config.max_position_embeddings
    card = (out / "README.md").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert f"validation loss of this checkpoint: {summary['val_loss']:.4f}" in card
    assert "tokens seen: 192 in 3" in card

def test_card_loss_curve_is_the_lm_loss_once_per_step(tmp_path):
    """The card's PNG: cross entropy (the LM loss of a penalty run, not loss + penalty), a resumed step drawn
    once (its last row), validation by step."""
    from yxanul.hub.card import loss_series, plot_loss

    rows = [{"step": s, "loss": 9.05 - s / 2, "lm_loss": 9.0 - s / 2} for s in range(1, 6)]
    rows += [{"step": 3, "loss": 7.6, "lm_loss": 7.55}, {"step": 5, "val_loss": 6.8}, {"step": 3, "val_loss": 7.4}]
    train, val = loss_series(rows)
    assert train == [(1, 8.5), (2, 8.0), (3, 7.55), (4, 7.0), (5, 6.5)] and val == [(3, 7.4), (5, 6.8)]
    assert loss_series([{"step": 1, "loss": 2.0}])[0] == [(1, 2.0)]  # no penalty: the loss is the LM loss
    assert plot_loss(rows, tmp_path / "l.png").read_bytes()[:4] == b"\x89PNG"
