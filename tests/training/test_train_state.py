"""`TrainState` is the one owner of a run's progress: a resume restores it whole (a field added to it
survives a real save -> resume with no other change), and a checkpoint in the version-2 format (a committed
``trainer_state.json`` written by the version-2 trainer for the run below) still resumes exactly."""

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from yxanul.checkpoint.manifest import write_manifest
from yxanul.config import parse_args
from yxanul.training import Trainer, TrainState, train

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "trainer_state_v2.json"
# the run that wrote the fixture: these flags, --eval_freq 2 --checkpoint_freq 1 --max_steps 2 (its step_2)
TINY = ["--model", "nano", "--seq_length", "32", "--micro_batch_size", "4", "--log_freq", "1", "--eval_steps", "2",
        "--sample_tokens", "0", "--warmup_steps", "1", "--max_lr", "2e-3", "--use_tensorboard", "false",
        "--num_workers", "0"]


def _cfg(tmp_path, *extra):
    return parse_args([*TINY, "--output_dir", str(tmp_path / "run"), *extra])


class _SetProbe:
    """Sets the added field once training begins; records what the trainer holds then."""

    def __init__(self, value=None):
        self.value, self.seen = value, None

    def on_train_begin(self, trainer):
        self.seen = trainer.state.probe
        if self.value is not None:
            trainer.state.probe = self.value


def test_a_field_added_to_train_state_survives_a_resume(tmp_path, monkeypatch, capsys):
    """A TrainState with one more field (as a future feature would add), through the real `train()`: its
    value is saved in trainer_state.json and a `--resume latest` run starts with it. Fails when resume
    copies chosen fields instead of taking the saved state whole. What is not progress comes from the
    resumed run's own batch plan: accumulating 2 micro-batches, its step counts 256 tokens, not 128."""
    import yxanul.training.trainer as trainer_mod

    extended = dataclasses.make_dataclass("Extended", [("probe", int, dataclasses.field(default=0))],
                                          bases=(TrainState,))
    monkeypatch.setattr(trainer_mod, "TrainState", extended)
    train(_cfg(tmp_path, "--max_steps", "2", "--eval_freq", "0"), callbacks=[_SetProbe(41)])
    ckpt = tmp_path / "run" / "checkpoints" / "step_2"
    assert json.loads((ckpt / "trainer_state.json").read_text())["probe"] == 41

    again = _SetProbe()
    summary = train(_cfg(tmp_path, "--max_steps", "3", "--eval_freq", "0", "--resume", "latest",
                         "--gradient_accumulation_steps", "2"), callbacks=[again])
    assert again.seen == 41 and (summary["steps"], summary["tokens_seen"]) == (3, 2 * 128 + 256)
    assert f"resumed from {ckpt} at step 2 (tokens_per_step: 128 -> 256)" in capsys.readouterr().out


def test_a_checkpoint_in_the_version_2_format_resumes_exactly(tmp_path):
    """Today's writer gives the same fields and values as the committed file of the same run at the same
    step; with that file in place of the new one (manifest re-signed), the resume restores every field of
    it and the next steps' losses are bit-identical to the uninterrupted run's."""
    cfg = _cfg(tmp_path, "--max_steps", "4", "--eval_freq", "0", "--checkpoint_freq", "0", "--save_final", "false")
    t = Trainer(cfg, callbacks=[]).setup()
    t.resume()
    out = [t.advance(t.next_batches()) for _ in range(2)][-1]
    ckpt = t.save(out)
    reference = [t.advance(t.next_batches()).loss for _ in range(2)]
    t.finish()

    old = json.loads(FIXTURE.read_text())
    new = json.loads((ckpt / "trainer_state.json").read_text())
    measured = {"val_loss", "best_val_loss", "saved_at"}  # the fixture's run evaluated at step 2; this one did not
    v3 = {"version", "val_sequences"}  # version 3 added the validation set's size
    assert set(new) == set(old) | v3 and (old["version"], new["version"]) == (2, 3)
    assert {k: v for k, v in new.items() if k not in measured | v3} == \
        {k: v for k, v in old.items() if k not in measured | v3}
    (ckpt / "trainer_state.json").write_text(FIXTURE.read_text())
    write_manifest(ckpt, lambda p, text: p.write_text(text))

    r = Trainer(_cfg(tmp_path, "--max_steps", "4", "--eval_freq", "0", "--checkpoint_freq", "0", "--save_final",
                     "false", "--resume", str(ckpt)), callbacks=[]).setup()
    assert r.resume() == ckpt
    progress = {f.name for f in dataclasses.fields(TrainState)} - {"evaluated_at"}
    assert dataclasses.asdict(r.state) == {**{k: old[k] for k in progress}, "evaluated_at": 2}
    resumed = [r.advance(r.next_batches()).loss for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(reference, resumed)), (reference, resumed)
    r.finish()


def test_a_resume_that_moves_the_lr_schedule_warns_with_the_flags_that_keep_it(tmp_path, capsys):
    """Training a finished run on with a longer --max_steps (no lr_decay_steps) moves the cosine: the LR at the
    resume step jumps from the run's floor back up, which was silent. One warning names the change, the LR both
    ways and the flag that keeps the run's schedule; with that flag the resume trains on at the run's floor."""
    train(_cfg(tmp_path, "--max_steps", "4", "--eval_freq", "0"), callbacks=[])
    capsys.readouterr()
    train(_cfg(tmp_path, "--max_steps", "8", "--eval_freq", "0", "--resume", "latest"), callbacks=[])
    out = capsys.readouterr().out
    floor = 2e-3 * 0.1  # max_lr x the default min_lr_ratio: where the 4-step run ended
    warning = re.search(r"^warning: this resume changes the LR schedule \(lr_decay_steps: 4 -> 8\): step 5 trains at "
                        r"lr (\S+), the run's schedule gave (\S+); --lr_decay_steps 4 keeps the run's schedule$",
                        out, re.M)
    assert warning and warning[2] == f"{floor:.3e}", out
    lr = float(warning[1])
    assert lr > 5 * floor
    # numbered as the console numbers it: the first step after the resume at step 4 is step 5, at the warning's lr
    assert re.search(rf"^step +5/8 .*lr: {lr:.2e} ", out, re.M), out

    step_4 = str(tmp_path / "run" / "checkpoints" / "step_4")  # the 4-step run's end, not the moved run's
    kept = Trainer(_cfg(tmp_path, "--max_steps", "8", "--eval_freq", "0", "--resume", step_4, "--lr_decay_steps",
                        "4"), callbacks=[])
    kept.setup().resume()
    kept.advance(kept.next_batches())
    kept.finish()
    assert "LR schedule" not in capsys.readouterr().out and kept.lr == pytest.approx(floor)


def test_a_resume_that_leaves_out_the_runs_cadence_or_names_init_from_says_so(tmp_path, capsys):
    """A resume without the run's --log_freq/--checkpoint_freq took the defaults in silence (a run saved every 2
    steps then saved every 100); an --init_from beside a resume was silently not used. One note each, naming the
    flags that keep the run's settings; a resume with them says nothing."""
    no_log_freq = [a for i, a in enumerate(TINY) if "--log_freq" not in TINY[i - 1:i + 1]]
    train(_cfg(tmp_path, "--max_steps", "4", "--eval_freq", "0", "--checkpoint_freq", "2"), callbacks=[])
    step_2 = tmp_path / "run" / "checkpoints" / "step_2"
    capsys.readouterr()
    train(parse_args([*no_log_freq, "--output_dir", str(tmp_path / "run"), "--max_steps", "6", "--eval_freq", "0",
                      "--resume", "latest", "--init_from", str(step_2)]), callbacks=[])
    notes = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("note: ")]
    ckpt = tmp_path / "run" / "checkpoints" / "step_4"
    now = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())  # the defaults this resume took
    assert notes == [f"note: this resume watches and keeps the run otherwise than it did: log_freq 1 -> "
                     f"{now['log_freq']}, checkpoint_freq 2 -> {now['checkpoint_freq']}; --log_freq 1 "
                     "--checkpoint_freq 2 keeps the run's",
                     f"note: init_from {step_2} is not used: the run resumes from {ckpt} (init_from starts a new run)"]
    train(_cfg(tmp_path, "--max_steps", "6", "--eval_freq", "0", "--checkpoint_freq", "2", "--resume", str(ckpt)),
          callbacks=[])  # step_4 was saved with the first run's settings: the same flags again
    assert "note: " not in capsys.readouterr().out
