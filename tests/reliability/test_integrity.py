"""Nothing silently wrong: every reader verifies the checkpoint it reads, `best` is the best checkpoint
that exists, and a resume checks what it resumes (tokenizer, data, val split, seq_length, seed)."""

import json
import math
from pathlib import Path

import pytest
import torch
from _reliability import ok, one_line, yx_here
from safetensors.torch import load_file, save_file
from tiny_run import FAST

from yxanul.checkpoint.manifest import MANIFEST, write_manifest
from yxanul.errors import UserError


def _zero_two_tensors(path):
    """Two weight tensors zeroed in place: same file size, another sha256 (what the manifest catches)."""
    state = load_file(str(path))
    for name in sorted(state)[:2]:
        state[name] = state[name] * 0
    save_file(state, str(path), metadata={"format": "pt"})


def _state(ckpt):
    return json.loads((ckpt / "trainer_state.json").read_text())


def test_every_reader_refuses_a_damaged_checkpoint_in_one_line(run_copy, tmp_path):
    ck = run_copy / "checkpoints"
    _zero_two_tensors(ck / "step_8" / "model.safetensors")
    sha = "model.safetensors does not match its sha256"
    one_line(yx_here("export", ck / "step_8", tmp_path / "e1"), 2, sha)
    one_line(yx_here("eval", ck / "step_8", "--eval_steps", "1"), 2, sha)
    one_line(yx_here("generate", ck / "step_8", "--max_new_tokens", "2"), 2, sha)
    one_line(yx_here("train", *FAST, "--max_steps", "2", "--output_dir", tmp_path / "r",
                     "--init_from", ck / "step_8"), 2, sha)
    assert not (tmp_path / "e1").exists()
    with open(ck / "step_6" / "model.safetensors", "r+b") as f:  # truncated: one line, not a traceback
        f.truncate(1000)
    one_line(yx_here("export", ck / "step_6", tmp_path / "e2"), 2, "model.safetensors has 1,000 bytes")
    for name in (MANIFEST, "trained_on.json"):  # an older checkpoint (before either file existed), truncated
        (ck / "step_4" / name).unlink()
    with open(ck / "step_4" / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    one_line(yx_here("export", ck / "step_4", tmp_path / "e3"), 2, "model.safetensors is truncated")


def test_a_run_dir_exports_the_newest_checkpoint_that_verifies_and_its_own_val_loss(run_copy, tmp_path):
    ck = run_copy / "checkpoints"
    assert (ck / "best").read_text().strip() == "step_8" and _state(ck / "step_8")["val_loss"] is not None
    _zero_two_tensors(ck / "step_8" / "model.safetensors")
    r = ok(yx_here("export", run_copy, tmp_path / "out"))
    warn = [line for line in r.stdout.splitlines() if "damaged" in line]
    assert len(warn) == 1 and "step_8" in warn[0] and "using step_6" in warn[0], r.stdout[-2000:]
    assert _state(tmp_path / "out")["step"] == 6
    card = (tmp_path / "out" / "README.md").read_text()
    # step_6 was not evaluated: the card must not quote step_8's val loss (it did, from metrics.jsonl)
    assert f"{_state(ck / 'step_8')['val_loss']:.4f}" not in card and "not measured" in card, card
    r = ok(yx_here("eval", run_copy, "--eval_steps", "1"))
    assert sum("damaged" in line for line in r.stdout.splitlines()) == 1


def test_best_is_the_best_checkpoint_that_exists_after_a_worse_re_save(run_copy):
    """Resume from an older step and re-save a step with a worse val loss: `best` named the worse model."""
    ck = run_copy / "checkpoints"
    common = [*FAST, "--checkpoint_freq", "2", "--keep_last", "10", "--eval_freq", "2", "--output_dir", run_copy]
    ok(yx_here("train", *common, "--max_steps", "10", "--resume", "latest"))
    good8, good10 = _state(ck / "step_8")["val_loss"], _state(ck / "step_10")["val_loss"]
    assert good10 < good8 and (ck / "best").read_text().strip() == "step_10"
    # from step_8 again, with a learning rate that wrecks the model: step_10 is re-saved, worse
    ok(yx_here("train", *common, "--max_steps", "10", "--resume", ck / "step_8", "--max_lr", "0.3"))
    worse10 = _state(ck / "step_10")["val_loss"]
    assert math.isfinite(worse10) and worse10 > good8, (worse10, good8)
    assert (ck / "best").read_text().strip() == "step_8"
    assert f"{good8:.4f}" in ok(yx_here("checkpoints", run_copy)).stdout


def _resume(run, *extra):
    return yx_here("train", *FAST, "--max_steps", "9", "--checkpoint_freq", "0", "--output_dir", run,
                   "--resume", "latest", *extra)


def monkeypatch_prepare(monkeypatch) -> list:
    """Records each data preparation the trainer asks for (and does it): a refused resume asks for none."""
    import yxanul.data.prepare as prep

    calls, real = [], prep.prepare
    monkeypatch.setattr(prep, "prepare", lambda args, *a, **k: calls.append(args) or real(args, *a, **k))
    return calls


def test_resume_refuses_other_seed_seq_length_or_data_unless_allowed(run_copy, tmp_path, monkeypatch):
    one_line(_resume(run_copy, "--seed", "7"), 2, "seed: 1337 -> 7")
    one_line(_resume(run_copy, "--seq_length", "16"), 2, "seq_length: 32 -> 16")
    # refused before the other split is prepared (it was prepared for nothing: progress bars, then the line)
    prepare = monkeypatch_prepare(monkeypatch)
    r = _resume(run_copy, "--val_fraction", "0.2")
    one_line(r, 2, "trained on other data settings (dataset: ")
    assert "(val_fraction 0.01 -> 0.2); val_split: val_fraction 0.01 -> val_fraction 0.2)" in r.stderr, r.stderr
    assert r.stderr.strip().endswith("--resume_allow_changes dataset val_split") and prepare == []
    assert not (run_copy / "checkpoints" / "step_9").exists()
    r = ok(_resume(run_copy, "--seed", "7", "--resume_allow_changes", "seed"))
    assert "warning: resume with another seed (1337 -> 7), allowed" in r.stdout
    assert "data order restarts at epoch 1" in r.stdout
    assert json.loads((run_copy / "checkpoints" / "step_9" / "trained_on.json").read_text())["seed"] == 7


def test_resume_refuses_another_tokenizer_of_the_same_vocabulary_size(run_copy, tmp_path):
    """Two token ids swapped: the same 8,192 entries, so only the recorded tokenizer hash can tell that
    the embeddings now mean other tokens."""
    import shutil

    bundled = Path(__file__).resolve().parents[2] / "yxanul" / "assets" / "tokenizer"
    other = tmp_path / "tok"
    shutil.copytree(bundled, other)
    spec = json.loads((other / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab["ow"], vocab["ing"] = vocab["ing"], vocab["ow"]
    (other / "tokenizer.json").write_text(json.dumps(spec))
    r = _resume(run_copy, "--tokenizer", other)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and "Traceback" not in r.stderr and last.startswith("error: "), r.stderr[-2000:]
    assert "tokenizer: " in last and "tokenizer" in last.split("--resume_allow_changes", 1)[1], last
    assert not (run_copy / "checkpoints" / "step_9").exists()


def test_a_checkpoint_without_records_resumes_with_one_note(run_copy):
    ckpt = run_copy / "checkpoints" / "step_8"
    (ckpt / "trained_on.json").unlink()
    write_manifest(ckpt, lambda p, text: p.write_text(text))
    r = ok(_resume(run_copy, "--seed", "7"))
    assert sum("could not check" in line for line in r.stdout.splitlines()) == 1, r.stdout[-2000:]


def test_trainer_integration_resumes_only_a_checkpoint_that_verifies(tmp_path, capsys):
    """transformers.Trainer resumed a damaged checkpoint-N silently: YxanulTrainer verifies it through
    the same `verified_checkpoint`, against the manifest its ManifestCallback wrote at the save."""
    from transformers import TrainingArguments

    from yxanul.data.args import DataArgs
    from yxanul.data.hf_dataset import ShardWindowDataset
    from yxanul.data.prepare import prepare
    from yxanul.integrations import YxanulTrainer
    from yxanul.models import ModelArgs, build_model
    from yxanul.precision import PrecisionArgs

    data = prepare(DataArgs(data_dir=str(tmp_path / "d"), max_documents=40, val_fraction=0.1), progress=False,
                   say=lambda *a, **k: None)
    vocab = json.loads((data / "meta.json").read_text())["vocab_size"]

    def run(steps, resume=None):
        args = TrainingArguments(output_dir=str(tmp_path / "o"), use_cpu=True, report_to=[], max_steps=steps,
                                 per_device_train_batch_size=2, save_steps=1, disable_tqdm=True)
        YxanulTrainer(model=build_model(ModelArgs(model="nano", seq_length=16, backend="torch"), vocab), args=args,
                      train_dataset=ShardWindowDataset(data, 16), precision=PrecisionArgs()
                      ).train(resume_from_checkpoint=resume)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as yx_here: ~5x faster on a loaded 2-core box
    try:
        _damage_and_resume(run, tmp_path, capsys)
    finally:
        torch.set_num_threads(threads)


def _damage_and_resume(run, tmp_path, capsys):
    run(2)
    ckpt2 = tmp_path / "o" / "checkpoint-2"
    assert (ckpt2 / MANIFEST).is_file()
    _zero_two_tensors(ckpt2 / "model.safetensors")
    with pytest.raises(UserError, match="checkpoint-2': damaged checkpoint .model.safetensors does not match"):
        run(3, resume=str(ckpt2))
    capsys.readouterr()
    run(2, resume=True)  # from checkpoint-1: one step, re-saving checkpoint-2
    out = capsys.readouterr().out
    assert "checkpoint-2 is damaged" in out and "resuming from checkpoint-1" in out, out[-2000:]
