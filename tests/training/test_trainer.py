"""End-to-end training on CPU through the real CLI: loss falls, exact resume, signals, listing."""

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from tiny_run import FAST
from tiny_run import yx as yxanul

from yxanul.tracking import read_metrics

# The tiny run on the bundled corpus and tokenizer (the real default data path), with a one-step warmup.
RUN = [*FAST, "--warmup_steps", "1"]


def train_losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r}


def test_end_to_end_loss_falls_and_artifacts(tmp_path):
    out = tmp_path / "run"
    r = yxanul("train", *RUN, "--max_steps", "40", "--output_dir", str(out), "--checkpoint_freq", "20",
               "--use_tensorboard", "true", "--eval_freq", "20", "--sample_tokens", "8")
    losses = train_losses(out)
    assert sorted(losses) == list(range(1, 41))
    first, last = sum(losses[s] for s in (1, 2, 3)) / 3, sum(losses[s] for s in (38, 39, 40)) / 3
    assert last < first - 1.0, (first, last)           # a real drop, not noise
    line = next(line for line in r.stdout.splitlines() if line.startswith("step   40/40 100% eta 0s |"))
    assert line.endswith("| FP32") and "| loss: " in line and "| tok/sec: " in line
    assert any(ln.startswith("step   20/40 50% eta ") for ln in r.stdout.splitlines())
    rows = read_metrics(out / "metrics.jsonl")
    assert {"step", "loss", "lr", "grad_norm", "dt_ms", "tokens_per_sec", "precision", "tokens_seen"} <= rows[0].keys()
    evals = [r for r in rows if "val_loss" in r]
    assert [e["step"] for e in evals] == [20, 40] and all("val_ppl" in e for e in evals)
    assert (out / "config.yaml").is_file() and (out / "precision_report.json").is_file()
    assert list((out / "tensorboard").rglob("events.out.tfevents.*"))
    hparams = yaml.safe_load(next((out / "tensorboard").rglob("hparams.yml")).read_text())  # the tracker config
    assert hparams["max_steps"] == 40 and hparams["precision_report/precision"] == "FP32"
    assert hparams["precision_report/layers/mlp/fp8"] == 0 and "precision_report/te_readback" in hparams
    state = json.loads((out / "checkpoints" / "step_40" / "trainer_state.json").read_text())
    assert state["step"] == 40 and state["precision"] == "FP32" and state["backend"] == "torch"
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_40"
    listing = yxanul("train", "--list_checkpoints", "--output_dir", str(out)).stdout
    assert "step_20" in listing and "step_40" in listing
    r = yxanul("train", "--list_checkpoints", check=False, cwd=tmp_path)  # no run dir: not a made-up one's listing
    assert r.returncode == 2 and r.stderr.strip().startswith("error: config key 'list_checkpoints': expected "
                                                             "--output_dir RUN_DIR"), r.stderr


def test_resume_is_exact(tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    common = [*RUN, "--lr_decay_steps", "40", "--checkpoint_freq", "0"]
    yxanul("train", *common, "--max_steps", "40", "--output_dir", str(full))
    yxanul("train", *common, "--max_steps", "20", "--output_dir", str(part))
    r = yxanul("train", *common, "--max_steps", "40", "--output_dir", str(part), "--resume", "latest")
    assert "resumed from" in r.stdout
    a, b = train_losses(full), train_losses(part)
    diffs = [abs(a[s] - b[s]) for s in range(21, 41)]
    assert max(diffs) <= 1e-5, max(diffs)


def test_a_resume_continues_the_random_states_the_checkpoint_saved(tmp_path):
    """torch's, Python's and NumPy's RNGs continue from the checkpoint (accelerate's ``random_states_0.pkl``),
    not from the seed: the resumed run ends with the uninterrupted run's states. The model's init draws from
    them after the seed, so a re-seed on resume (or no restore, in a process seeded otherwise) ends elsewhere; so
    would a loader that drew its iterators' base seeds from the global RNG (one more draw after the resume)."""
    import random

    import numpy as np

    from yxanul.config import parse_args
    from yxanul.training import train

    def states():
        return torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()

    flags = [*RUN, "--checkpoint_freq", "2"]
    train(parse_args([*flags, "--max_steps", "4", "--output_dir", str(tmp_path / "full")]))
    full = states()
    train(parse_args([*flags, "--max_steps", "2", "--output_dir", str(tmp_path / "part")]))
    random.seed(7), torch.manual_seed(7), np.random.seed(7)  # another process's states
    summary = train(parse_args([*flags, "--max_steps", "4", "--output_dir", str(tmp_path / "part"), "--resume",
                                "latest"]))
    resumed = states()
    assert summary["logged_steps"] == 2  # this session's steps 3 and 4 (log_freq 1), what its `done:` line spans
    assert torch.equal(resumed[0], full[0]) and resumed[1] == full[1] and (resumed[2] == full[2]).all()


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="needs POSIX signals")
@pytest.mark.parametrize("sig,workers,group", [("SIGUSR1", "0", False), ("SIGTERM", "2", True)])
def test_stop_signal_saves_and_exits_zero(tmp_path, sig, workers, group):
    """group: SIGTERM to the whole process group, DataLoader workers included (torchrun's killpg, SLURM)."""
    out = tmp_path / "sig"
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    p = subprocess.Popen([sys.executable, "-m", "yxanul", "train", *RUN, "--max_steps", "100000",
                          "--checkpoint_freq", "0", "--output_dir", str(out), "--num_workers", workers],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=group)
    deadline = time.time() + 120
    while time.time() < deadline and not (out / "metrics.jsonl").exists():
        time.sleep(0.5)
    time.sleep(2)
    if group:
        os.killpg(p.pid, getattr(signal, sig))
    else:
        p.send_signal(getattr(signal, sig))
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 0, stderr[-2000:]
    assert "checkpoint saved" in stdout
    state = json.loads((out / "checkpoints" / (out / "checkpoints" / "latest").read_text().strip()
                        / "trainer_state.json").read_text())
    assert 0 < state["step"] < 100000


@pytest.mark.skipif(__import__("importlib").util.find_spec("wandb") is None, reason="wandb not installed")
def test_wandb_offline_without_key(tmp_path):
    out = tmp_path / "wb"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HF_HUB_OFFLINE="1", HOME=str(tmp_path))  # no ~/.netrc, no API key
    r = subprocess.run([sys.executable, "-m", "yxanul", "train", *RUN, "--max_steps", "3", "--warmup_steps", "1",
                        "--output_dir", str(out),
                        "--use_wandb", "--checkpoint_freq", "0", "--save_final", "false"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "W&B: no API key found, logging offline" in r.stdout
    assert list((out / "wandb").glob("offline-run-*"))
    log = next((out / "wandb").glob("offline-run-*/run-*.wandb")).read_bytes()  # W&B's record log, with the config
    assert b"precision_report/te_readback" in log and b"precision_report/layers/mlp/fp8" in log


# Counts, in a real training process, the model's training forwards (F) and the optimizer's real
# updates (S): accelerate's accumulation counter must not drift when accumulation changes.
_HOOKED = """
import sys
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook
events = []
register_optimizer_step_post_hook(lambda opt, a, k: events.append("S"))
register_module_forward_pre_hook(
    lambda m, a: events.append("F") if type(m).__name__ == "YxanulForCausalLM" and m.training else None)
from yxanul.cli import main
rc = main(sys.argv[1:])
print("EVENTS", "".join(events))
sys.exit(rc)
"""


def _events(*args) -> str:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    r = subprocess.run([sys.executable, "-c", _HOOKED, "train", *args, "--warmup_steps", "1"], capture_output=True,
                       text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return next(line.split()[1] for line in r.stdout.splitlines() if line.startswith("EVENTS"))


def test_every_update_applies_exactly_accum_micro_batches_when_accumulation_changes(tmp_path):
    cfg = tmp_path / "c.yaml"  # 96 tokens per step: 4 x 24, then 3 x 32
    cfg.write_text("curriculum:\n  - {seq_length: 24, until_steps: 1}\n  - {seq_length: 32}\n"
                   "target_tokens_per_step: 96\n")
    common = [*RUN, "--micro_batch_size", "1", "--eval_freq", "0", "--checkpoint_freq", "0"]
    assert _events("--config", str(cfg), *common, "--max_steps", "4", "--save_final", "false",
                   "--output_dir", str(tmp_path / "cur")) == "FFFFS" + "FFFS" * 3
    # resume with another accumulation (accelerate's load_state restores its old micro counter)
    run = ["--micro_batch_size", "2", "--output_dir", str(tmp_path / "res")]
    assert _events(*RUN, *run, "--gradient_accumulation_steps", "3", "--max_steps", "3") == "FFFS" * 3
    assert _events(*RUN, *run, "--gradient_accumulation_steps", "2", "--max_steps", "6",
                   "--resume", "latest") == "FFS" * 3
    rows = [r for r in read_metrics(tmp_path / "res" / "metrics.jsonl") if "loss" in r]
    assert [r["tokens_seen"] for r in rows] == [192, 384, 576, 704, 832, 960]  # 3 x 2 x 32, then 2 x 2 x 32


def test_divergence_stops_without_saving_over_good_checkpoints(tmp_path):
    """Good checkpoints first (steps 2 and 4), then the run goes on at max_lr 1e30 with a checkpoint at every
    step (1e30: the first update puts ~1e30 into the weights, the next matmuls overflow fp32, so the run
    diverges rather than collapsing to a zero gradient as at 1e4): the first step whose loss or gradient
    norm is not finite stops with one line (exit 3) and no checkpoint of it; `latest` names the checkpoint
    of the step before, which exists and is finite."""
    from safetensors.torch import load_file

    out = tmp_path / "nan"
    yxanul("train", *RUN, "--max_steps", "4", "--checkpoint_freq", "2", "--output_dir", str(out))
    r = yxanul("train", *RUN, "--max_lr", "1e30", "--warmup_steps", "0", "--log_freq", "10", "--max_steps", "40",
               "--checkpoint_freq", "1", "--keep_last", "2", "--output_dir", str(out), "--resume", "latest",
               check=False)
    assert r.returncode == 3 and r.stderr.startswith("error: step "), r.stderr[-2000:]
    assert "not finite" in r.stderr or "gradient norm nan" in r.stderr or "loss nan" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    diverged = int(r.stderr.removeprefix("error: step ").split(":")[0])
    assert diverged > 5, r.stderr  # a step of the resumed run, after a good checkpoint of its own
    ckpts = out / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == f"step_{diverged - 1}"
    assert json.loads((ckpts / f"step_{diverged - 1}" / "trainer_state.json").read_text())["step"] == diverged - 1
    assert not (ckpts / f"step_{diverged}").exists()
    for d in ckpts.glob("step_*"):  # whatever was saved is finite
        assert all(bool(t.isfinite().all()) for t in load_file(d / "model.safetensors").values()), d


def _in_process(argv, capsys, cwd, monkeypatch) -> tuple[int, str]:
    """(exit code, stderr) of `yxanul ARGV` through the entry point in this process: for the errors raised before
    a run is built, where a new interpreter per case only costs seconds (`yxanul` above is the subprocess form)."""
    from yxanul.cli import main

    monkeypatch.chdir(cwd)
    capsys.readouterr()
    code = main(list(map(str, argv)))
    return code, capsys.readouterr().err


def test_run_dir_guards_and_bad_values_are_one_line_errors(tmp_path, capsys, monkeypatch):
    out = tmp_path / "r"
    short = [*RUN, "--warmup_steps", "0"]  # warmup must end before max_steps
    yxanul("train", *short, "--max_steps", "2", "--output_dir", str(out))
    again = yxanul("train", *short, "--max_steps", "2", "--output_dir", str(out), check=False)
    assert again.returncode == 2 and "already holds checkpoints (newest: step 2)" in again.stderr
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_2"
    from yxanul.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["train", *short, "--max_steps", "1", "--output_dir", str(out), "--resume", "latest"]) == 0
    assert f"training 0 steps from step 2 into {out} (the checkpoint is past max_steps 1)" in capsys.readouterr().out
    mismatch = yxanul("train", *short, "--max_steps", "4", "--output_dir", str(out), "--resume", "latest",
                      "--model", "gpt2-124m", check=False)
    assert mismatch.returncode == 2 and "its weights do not fit this model (model: 'nano' -> 'gpt2-124m')" \
        in mismatch.stderr, mismatch.stderr[-1500:]
    (tmp_path / "file").write_text("x")
    for args, needle in [(["--resume", "latest"], "set --output_dir or --run_name"),
                         (["--output_dir", str(tmp_path / "file" / "run")], "is not a directory"),
                         (["--beta1", "1.5"], "'beta1'"), (["--adam_eps", "-1"], "'adam_eps'"),
                         (["--max_lr", "nan"], "'max_lr'"), (["--seed", "-1"], "'seed'")]:
        code, err = _in_process(["train", *short, "--max_steps", "1", *args], capsys, tmp_path, monkeypatch)
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, (args, err[-1500:])


def test_resume_latest_needs_a_checkpoint_and_auto_starts_fresh_once(tmp_path, capsys, monkeypatch):
    """`--resume latest` into a directory without a checkpoint (a typo) is one line naming it, exit 2,
    before anything is built; `--resume auto` starts fresh there and resumes on the next start."""
    short = [*RUN, "--warmup_steps", "1", "--checkpoint_freq", "0"]
    for resume, where in [("latest", str(tmp_path / "typo")), (str(tmp_path / "typo" / "step_3"), "typo/step_3")]:
        code, err = _in_process(["train", *short, "--max_steps", "2", "--output_dir", tmp_path / "typo", "--resume",
                                 resume], capsys, tmp_path, monkeypatch)
        assert code == 2 and where in err and len(err.strip().splitlines()) == 1, err[-1500:]
        assert not (tmp_path / "typo").exists()
    out = tmp_path / "auto"
    first = yxanul("train", *short, "--max_steps", "2", "--output_dir", str(out), "--resume", "auto")
    assert f"resume auto: no checkpoint under {out}: starting a new run" in first.stdout
    again = yxanul("train", *short, "--max_steps", "3", "--output_dir", str(out), "--resume", "auto")
    assert f"resumed from {out / 'checkpoints' / 'step_2'} at step 2" in again.stdout
    assert sorted(train_losses(out)) == [1, 2, 3]


def test_checkpoints_carry_only_a_val_loss_of_their_own_step(tmp_path):
    out = tmp_path / "v"
    yxanul("train", *RUN, "--max_steps", "12", "--eval_freq", "6", "--checkpoint_freq", "4", "--keep_last", "5",
           "--output_dir", str(out))
    vals = {d.name: json.loads((d / "trainer_state.json").read_text())["val_loss"]
            for d in (out / "checkpoints").glob("step_*")}
    assert vals["step_4"] is None and vals["step_8"] is None and vals["step_12"] is not None
    assert (out / "checkpoints" / "best").read_text().strip() == "step_12"


# ---------------------------------------------------------------------------- in-process Trainer
def _cfg(tmp_path, *extra):
    from yxanul.config import parse_args

    return parse_args([*RUN, "--warmup_steps", "1", "--checkpoint_freq", "0", "--save_final", "false",
                       "--output_dir", str(tmp_path / "run"), *extra])  # warmup must fit in the short runs


def test_summary_line_says_stopped_and_what_this_session_did():
    """The last line of a run: a stop before the last step is 'stopped at step N of M', a session with no
    logged step says so (it printed 'loss None -> None'), a finished one keeps 'done: '."""
    from yxanul.training import TrainState
    from yxanul.training.reporting import run_summary, summary_line

    st = TrainState()
    st.step, st.tokens_seen = 40, 5120
    stopped = summary_line(run_summary(st, None, None, "FP32", 3.0, "r"), max_steps=150)
    assert stopped == ("stopped at step 40 of 150 (checkpoint saved; the same command with --resume latest "
                       "--output_dir r continues): 40 steps, 5,120 tokens in 3.0s; no step trained in this session; "
                       "no validation loss yet")  # the run dir: a default one is new at every launch
    spaced = summary_line(run_summary(st, None, None, "FP32", 3.0, "/data/my runs/exp 1"), max_steps=150)
    assert "--output_dir '/data/my runs/exp 1' continues" in spaced  # pasted into a shell as it is
    st.step, st.val_loss = 150, 4.5
    done = summary_line(run_summary(st, 9.0, 5.25, "FP32", 3.0, "r", logged_steps=15), max_steps=150)
    assert done.startswith("done: 150 steps") and done.endswith("loss 9.000000 -> 5.250000; val_loss 4.500000")
    once = summary_line(run_summary(st, 5.25, 5.25, "FP32", 3.0, "r", logged_steps=1), max_steps=150)
    assert once.endswith("; loss 5.250000 (the one step logged in this session); val_loss 4.500000")  # not 'X -> X'
    st.step = 77  # stopped between two logged steps: the last loss is step 60's, and says so
    late = summary_line(run_summary(st, 9.0, 6.33, "FP32", 3.0, "r", logged_steps=3, last_logged_step=60),
                        max_steps=150)
    assert "; loss 9.000000 -> 6.330000 (step 60, the last logged); val_loss" in late
    assert "the last logged" not in summary_line(run_summary(st, 9.0, 6.33, "FP32", 3.0, "r", logged_steps=3,
                                                             last_logged_step=77), max_steps=150)


def test_progress_line_fills_a_long_gap_between_logged_steps(tmp_path, capsys, monkeypatch):
    """Steps between two logs print `step N/MAX P% eta T` once QUIET_S passed without a line (0 here:
    every unlogged step), from the step timer alone; metrics.jsonl keeps only the logged steps."""
    import yxanul.training.trainer as tr

    monkeypatch.setattr(tr, "QUIET_S", 0.0)
    tr.train(_cfg(tmp_path, "--max_steps", "4", "--log_freq", "4"))
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(" eta ")[0] for ln in lines if re.match(r"step +[23]/", ln)] == ["step    2/4 50%",
                                                                                     "step    3/4 75%"]
    assert sorted(train_losses(tmp_path / "run")) == [1, 4]


def test_trainer_step_log_eval_save_and_exact_resume_in_process(tmp_path):
    """The Trainer's methods, called one by one on the tiny CPU model: a step changes the weights and
    advances the state; log writes metrics.jsonl; evaluate (sampling on) leaves the RNG untouched; a
    save + resume round trip continues with bit-identical losses."""
    import torch

    from yxanul.training import Trainer
    from yxanul.training.state import read_state_file

    t = Trainer(_cfg(tmp_path, "--max_steps", "4", "--sample_tokens", "6")).setup()
    assert t.resume() is None and t.state.step == 0
    before = [p.detach().clone() for p in t.model.parameters()]
    out = t.advance(t.next_batches())
    assert (t.state.step, t.state.tokens_seen) == (1, 4 * 32) and out.accum == 1
    assert torch.equal(out.lm_loss, out.loss) and out.penalty.item() == 0.0  # no penalty: loss == LM loss
    assert abs(out.loss.item() - math.log(t.mcfg.vocab_size)) < 0.5  # the initial loss is ~ln V
    assert any(not torch.equal(a, b) for a, b in zip(before, t.model.parameters()))
    row = t.log(out)
    assert row["loss"] == pytest.approx(out.loss.item()) and read_metrics(t.run_dir / "metrics.jsonl")[-1] == row
    assert "lm_loss" not in row and "penalty" not in row  # the default line and metrics stay as they were
    out = t.advance(t.next_batches())
    rng = torch.get_rng_state()
    ev = t.evaluate()
    assert torch.equal(rng, torch.get_rng_state())  # the sample forks the RNG: resume stays exact
    assert ev["sample"] and math.isfinite(ev["val_loss"]) and t.state.best_val_loss == ev["val_loss"]
    ckpt = t.save(out)
    saved, wrote = read_state_file(ckpt)
    assert (saved.step, saved.val_loss, saved.best_val_loss, wrote.tokens_per_step) == (2, ev["val_loss"],
                                                                                        ev["val_loss"], 128)
    reference = [t.advance(t.next_batches()).loss for _ in range(2)]
    assert t.finish()["last_logged_step"] == 1  # steps 2-4 ran unlogged: the summary's last loss is step 1's

    r = Trainer(_cfg(tmp_path, "--max_steps", "4", "--resume", str(ckpt))).setup()
    assert r.resume() == ckpt and (r.state.step, r.state.tokens_seen) == (2, 256)
    assert r.state.best_val_loss == ev["val_loss"] and r.state.evaluated_at == 2
    resumed = [r.advance(r.next_batches()).loss for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(reference, resumed)), (reference, resumed)
    r.finish()


def test_the_epoch_logged_and_saved_is_the_one_the_step_trained_on(tmp_path):
    """The last step of an epoch was logged (console and metrics.jsonl) and saved as the next epoch: the loader's
    `epoch` is the next batch's. Now the step's own; its checkpoint keeps the next batch's place beside it, and
    a resume from it logs the next epoch from its first step on."""
    import yxanul.training.trainer as tr
    from yxanul.data.args import DataArgs
    from yxanul.data.loader import WindowLoader
    from yxanul.data.prepare import prepare

    docs = tmp_path / "docs.jsonl"
    docs.write_text("\n".join(json.dumps({"text": f"Document {i}: " + "word " * 40}) for i in range(20)))
    data = prepare(DataArgs(dataset=str(docs), data_dir=str(tmp_path / "d"), val_fraction=0.2), progress=False,
                   say=lambda *a, **k: None)
    spe = WindowLoader(data, "train", 32, 8, seed=0)._ds.steps_per_epoch
    assert 2 <= spe <= 3, spe
    run = ("--data_dir", str(data), "--micro_batch_size", "8", "--max_steps", str(spe + 2))
    tr.train(_cfg(tmp_path, *run, "--checkpoint_freq", str(spe)))
    rows = {r["step"]: r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r}
    assert [rows[s]["epoch"] for s in range(1, spe + 3)] == [0] * spe + [1] * 2
    ckpt = tmp_path / "run" / "checkpoints" / f"step_{spe}"
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["epoch"] == 0 and (state["data"]["epoch"], state["data"]["position"]) == (1, 0)
    tr.train(_cfg(tmp_path, *run, "--resume", str(ckpt)))
    resumed = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r][-2:]
    assert [(r["step"], r["epoch"], r["loss"]) for r in resumed] == [(s, 1, rows[s]["loss"]) for s in
                                                                      (spe + 1, spe + 2)]


def test_a_damaged_latest_never_costs_the_checkpoint_the_resume_fell_back_to(tmp_path, capsys):
    """keep_last 2, step_2 and step_4 saved, step_4's optimizer.bin truncated: the resume falls back to step_2,
    and its save at step 6 keeps step_2 (the damaged step_4 counted among the two newest pruned it: one bad
    file from having no good checkpoint); a step the resumed run saves again counts as its own."""
    from yxanul.checkpoint import list_checkpoints
    from yxanul.checkpoint.manifest import verify_checkpoint
    from yxanul.training import train

    def steps():
        return [c["step"] for c in list_checkpoints(tmp_path / "run")]

    keep = ("--keep_last", "2", "--save_final", "true")
    train(_cfg(tmp_path, "--max_steps", "4", "--checkpoint_freq", "2", *keep))
    opt = tmp_path / "run" / "checkpoints" / "step_4" / "optimizer.bin"
    opt.write_bytes(opt.read_bytes()[:100])
    train(_cfg(tmp_path, "--max_steps", "6", "--checkpoint_freq", "6", "--resume", "latest", *keep))
    assert "resuming from step_2" in capsys.readouterr().out and steps() == [2, 6]
    opt = tmp_path / "run" / "checkpoints" / "step_6" / "optimizer.bin"
    opt.write_bytes(opt.read_bytes()[:100])
    train(_cfg(tmp_path, "--max_steps", "8", "--checkpoint_freq", "2", "--resume", "latest", *keep))
    assert steps() == [6, 8] and not any(verify_checkpoint(c["path"]) for c in list_checkpoints(tmp_path / "run"))


def test_train_state_schema_round_trip_and_one_line_errors(tmp_path):
    from yxanul.errors import UserError
    from yxanul.training import TrainState
    from yxanul.training.state import RunInfo, parse_state_file, read_state_file, state_file_dict

    st, info = TrainState(step=3, tokens_seen=96, data={"epoch": 0}), RunInfo(world_size=2)
    assert parse_state_file(state_file_dict(st, info)) == (st, info)
    st.record_eval(float("nan"))  # a NaN eval never becomes the best, and None never compares
    st.record_eval(2.5)
    st.record_eval(3.0)
    assert st.best_val_loss == 2.5 and parse_state_file(state_file_dict(st, info))[0] == st
    st.step += 1  # val_loss is saved only when it was measured at the saved step
    back = parse_state_file(state_file_dict(st, info))[0]
    assert (back.val_loss, back.evaluated_at, back.best_val_loss) == (None, None, 2.5)
    d = state_file_dict(st, info)
    v1 = {k: v for k, v in d.items() if k not in ("version", "best_val_loss", "wandb_run_id")}
    assert parse_state_file(v1)[1].version == 1  # checkpoints written before the schema had a version
    with pytest.raises(UserError, match=r"^x/trainer_state.json: unknown field 'bogus'"):
        parse_state_file({**d, "bogus": 1}, source="x/trainer_state.json")
    for field in ("data", "world_size"):  # progress and run info alike
        with pytest.raises(UserError, match=rf"missing field '{field}'"):
            parse_state_file({k: v for k, v in d.items() if k != field})
    (tmp_path / "trainer_state.json").write_text("{not json")
    with pytest.raises(UserError, match="not a readable trainer state"):
        read_state_file(tmp_path)


def test_callbacks_get_eval_metrics_saves_and_the_end(tmp_path):
    from yxanul.training import train

    class Recorder:
        def __init__(self):
            self.events = []

        def on_evaluate(self, trainer):
            self.events.append(("eval", trainer.state.step))
            return {"answer": 42.0}

        def on_save(self, trainer, ckpt_dir, is_best):
            self.events.append(("save", ckpt_dir.name, is_best))

        def on_train_end(self, trainer):
            self.events.append(("end", trainer.state.step))

    class Second:  # another callback's metrics join the first's in the same row
        def on_evaluate(self, trainer):
            return {"other": 7.0}

    rec = Recorder()
    summary = train(_cfg(tmp_path, "--max_steps", "3", "--eval_freq", "2", "--checkpoint_freq", "1",
                         "--save_final", "true"), callbacks=[rec, Second()])
    assert rec.events == [("save", "step_1", False), ("eval", 2), ("save", "step_2", True), ("eval", 3),
                          ("save", "step_3", summary["best_val_loss"] == summary["val_loss"]), ("end", 3)]
    evals = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "val_loss" in r]
    assert [(e["answer"], e["other"]) for e in evals] == [(42.0, 7.0), (42.0, 7.0)]


@pytest.mark.slow
@pytest.mark.skipif(__import__("importlib").util.find_spec("wandb") is None, reason="wandb not installed")
def test_wandb_resume_continues_the_same_run(tmp_path, monkeypatch):
    """W&B offline: the run id is kept in the run dir and the checkpoint; --resume logs into the same run."""
    from yxanul.training import TrainState, train

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    train(_cfg(tmp_path, "--max_steps", "2", "--use_wandb", "--save_final", "true"))
    run = tmp_path / "run"
    run_id = (run / "wandb_run_id").read_text().strip()
    assert TrainState.read(run / "checkpoints" / "step_2").wandb_run_id == run_id
    train(_cfg(tmp_path, "--max_steps", "3", "--use_wandb", "--resume", "latest"))
    dirs = sorted((run / "wandb").glob("offline-run-*"))
    assert len(dirs) == 2 and all(d.name.endswith(f"-{run_id}") for d in dirs), dirs
    assert (run / "wandb_run_id").read_text().strip() == run_id


def test_a_resumed_run_keeps_one_tensorboard_run_whose_steps_are_logged_once(tmp_path):
    """Resuming an older checkpoint of a run that logged past it (as after a crash between checkpoints): the
    sessions write one TensorBoard run (the run name of the first session, not a new default name) and the
    resumed steps replace the earlier session's (TensorBoard's purge_step), so every step appears once."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from yxanul.config import parse_args
    from yxanul.training import train

    run = tmp_path / "run"
    flags = [*RUN, "--warmup_steps", "1", "--use_tensorboard", "true", "--checkpoint_freq", "2",
             "--output_dir", str(run)]
    train(parse_args([*flags, "--max_steps", "4"]))
    train(parse_args([*flags, "--max_steps", "5", "--resume", str(run / "checkpoints" / "step_2")]))
    runs = [d for d in (run / "tensorboard").iterdir() if d.is_dir()]
    assert [d.name for d in runs] == [yaml.safe_load((run / "config.yaml").read_text())["run_name"]]
    acc = EventAccumulator(str(runs[0]), size_guidance={"scalars": 0}).Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3, 4, 5]
    assert train_losses(run)[5] == pytest.approx(acc.Scalars("train/loss")[-1].value, rel=1e-6)


def test_tensorboard_gets_the_training_perplexity_and_each_evaluations_sample(tmp_path):
    """train/ppl (exp of the LM loss) beside train/loss, and the generated sample of each evaluation as
    TensorBoard text (W&B gets the same string), the one samples.txt also keeps."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from yxanul.config import parse_args
    from yxanul.training import train

    run = tmp_path / "run"
    train(parse_args([*RUN, "--use_tensorboard", "true", "--max_steps", "2", "--eval_freq",
                      "2", "--sample_tokens", "6", "--output_dir", str(run)]))
    [tb] = [d for d in (run / "tensorboard").iterdir() if d.is_dir()]
    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    losses = {e.step: e.value for e in acc.Scalars("train/loss")}
    assert {e.step: e.value for e in acc.Scalars("train/ppl")} == pytest.approx(
        {s: math.exp(v) for s, v in losses.items()}, rel=1e-5)
    [text] = acc.Tensors("eval/sample/text_summary")
    sample = text.tensor_proto.string_val[0].decode()
    assert text.step == 2 and sample and sample in (run / "samples.txt").read_text()


@pytest.mark.skipif(__import__("importlib").util.find_spec("wandb") is None, reason="wandb not installed")
def test_turning_wandb_on_at_a_resume_keeps_the_tensorboard_run(tmp_path, monkeypatch):
    """accelerate names its trackers from one project name, W&B's project when W&B is on: TensorBoard keeps
    ``tensorboard/<run_name>`` anyway, so a session with ``--use_wandb`` continues the same curve."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from yxanul.config import parse_args
    from yxanul.training import train

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    run = tmp_path / "run"
    flags = [*RUN, "--use_tensorboard", "true", "--checkpoint_freq", "2", "--output_dir", str(run)]
    train(parse_args([*flags, "--max_steps", "2"]))
    train(parse_args([*flags, "--max_steps", "4", "--use_wandb", "--wandb_project", "proj", "--resume", "latest"]))
    assert list((run / "wandb").glob("offline-run-*"))  # W&B did log
    runs = [d.name for d in (run / "tensorboard").iterdir() if d.is_dir()]
    assert runs == [yaml.safe_load((run / "config.yaml").read_text())["run_name"]]
    acc = EventAccumulator(str(run / "tensorboard" / runs[0]), size_guidance={"scalars": 0}).Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3, 4]


@pytest.mark.slow
def test_torch_compile_trains_on_cpu(tmp_path):
    """--torch_compile: the compiled model trains (and checkpoints under its original names)."""
    from yxanul.training import train

    summary = train(_cfg(tmp_path, "--max_steps", "2", "--torch_compile", "--save_final", "true"))
    assert summary["steps"] == 2 and math.isfinite(summary["last_loss"])
    from safetensors.torch import load_file

    names = load_file(tmp_path / "run" / "checkpoints" / "step_2" / "model.safetensors").keys()
    assert "model.embed_tokens.weight" in names and not any("_orig_mod" in n for n in names)


def test_torch_compile_with_fp8_is_a_one_line_config_error(tiny_config):
    """TorchDynamo fails on TE's FP8 weights (seen on an H200): refused before anything is traced."""
    from yxanul.errors import ConfigError
    from yxanul.models import YxanulForCausalLM
    from yxanul.training.runtime import compile_model

    model = YxanulForCausalLM(tiny_config())
    with pytest.raises(ConfigError, match="^config key 'torch_compile': expected false with FP8"):
        compile_model(model, "cuda", fp8_enabled=True)
    assert compile_model(model, "cpu") is not model  # without FP8: compiled (lazily: nothing traced yet)


def test_train_step_accumulates_and_reports_lm_loss_and_penalty_apart(tiny_config):
    """A model whose forward returns loss = lm_loss + penalty (as the penalty feature's will): the one
    step sums each over micro-batches, and validation uses the LM loss only. Accumulating 2 micro-
    batches gives the same update as one step over both (loss scaled by 1/accum)."""
    import copy

    import torch
    from accelerate import Accelerator

    from yxanul.models import YxanulForCausalLM
    from yxanul.training.evaluation import evaluate_loss
    from yxanul.training.step import train_step

    class Penalised(YxanulForCausalLM):  # a z-loss-like term on top of the real model's loss
        def forward(self, input_ids, shift_labels=None, return_logits=False, **kw):
            out = super().forward(input_ids, shift_labels=shift_labels, return_logits=True, **kw)
            penalty = 1e-2 * torch.logsumexp(out.logits.float(), -1).pow(2).mean()
            out.lm_loss, out.penalty, out.loss = out.loss, penalty, out.loss + penalty
            return out

    torch.manual_seed(0)
    model = Penalised(tiny_config())
    twin = copy.deepcopy(model)
    x = torch.randint(0, 1000, (4, 16))
    halves = [(x[:2], x[:2]), (x[2:], x[2:])]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = train_step(model, opt, halves, max_grad_norm=0.0)
    assert out.accum == 2 and torch.allclose(out.loss, out.lm_loss + out.penalty)
    ref = twin(x, shift_labels=x)
    assert torch.allclose(out.lm_loss / 2, ref.lm_loss, atol=1e-5) and torch.allclose(out.penalty / 2, ref.penalty,
                                                                                      atol=1e-6)
    ref.loss.backward()
    torch.optim.SGD(twin.parameters(), lr=0.1).step()
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(model.parameters(), twin.parameters()))
    acc = Accelerator(cpu=True)
    val = evaluate_loss(model, [(x, x)], None, acc)
    with torch.no_grad():
        assert val == pytest.approx(model(x, shift_labels=x).lm_loss.item(), rel=1e-6)  # not the total


@pytest.mark.gpu
@pytest.mark.parametrize("extra", [[], ["--mixed_precision", "bf16", "--master_weights", "fp32"]],
                         ids=["plain", "masters"])
def test_the_trainer_steps_the_fused_cuda_adamw(tmp_path, extra):
    """The optimizer is built with the params already on the GPU, so AdamW's fused kernel is used
    (built on CPU params it silently falls back to the slower foreach path)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from yxanul.training import Trainer

    t = Trainer(_cfg(tmp_path, "--max_steps", "2", "--backend", "torch", *extra)).setup()
    inner = getattr(t.optimizer, "optimizer", t.optimizer)
    assert inner.defaults.get("fused") is True
    assert all(p.is_cuda for g in inner.param_groups for p in g["params"])


def test_a_run_longer_than_its_data_says_how_often_it_rereads_it(tmp_path, capsys):
    """max_steps x tokens per step beyond the prepared tokens: one warning line at setup (a mixture that
    ended early would otherwise be looped over silently); a run within its data prints none."""
    from yxanul.training import Trainer

    Trainer(_cfg(tmp_path / "a", "--max_steps", "5")).setup()
    assert "reads the prepared data" not in capsys.readouterr().out
    Trainer(_cfg(tmp_path / "b", "--max_steps", "100000")).setup()
    line = [ln for ln in capsys.readouterr().out.splitlines() if "reads the prepared data" in ln]
    assert len(line) == 1 and line[0].startswith("warning: max_steps 100,000 reads the prepared data"), line


@pytest.mark.skipif(__import__("importlib").util.find_spec("deepspeed") is None, reason="deepspeed not installed")
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the notice is DeepSpeed's CPU fallback")
def test_deepspeeds_cpu_notice_is_not_printed_by_a_run(tmp_path):
    """accelerate imports DeepSpeed in every run (unwrap_model); on a CPU its import logs "Setting accelerator
    to CPU ..." to stdout. The trainer imports it first with that one message dropped; other messages pass.
    A real one-step run in a fresh process (DeepSpeed not imported yet), then a DeepSpeed warning."""
    argv = ["train", *RUN, "--max_steps", "1", "--warmup_steps", "0", "--output_dir", str(tmp_path / "run")]
    code = (f"import logging, sys\nfrom yxanul.cli import main\nrc = main({argv!r})\n"
            "logging.getLogger('DeepSpeed').warning('another warning')\nprint('deepspeed' in sys.modules, rc)\n")
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1"))
    plain = subprocess.run([sys.executable, "-c", "import deepspeed"], capture_output=True, text=True, timeout=300)
    assert "Setting accelerator to CPU" in plain.stdout + plain.stderr  # what a run printed before
    assert "done: 1 steps" in quiet.stdout, quiet.stdout[-2000:] + quiet.stderr[-2000:]
    assert "Setting accelerator" not in quiet.stdout + quiet.stderr and "another warning" in quiet.stdout
    assert quiet.stdout.strip().endswith("True 0"), quiet.stderr[-2000:]
