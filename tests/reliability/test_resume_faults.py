"""Damaged checkpoints through `yxanul train --resume`: fall back with one line and resume exactly,
or stop with one line (exit 2); pickles that would run code are refused (issue 17 items 2, 3)."""

import json
import os

import pytest
import torch
from _reliability import losses, ok, one_line, yx_here
from tiny_run import FAST

from yxanul.checkpoint.manifest import MANIFEST, write_manifest


def _flip(p):
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0x01
    p.write_bytes(bytes(b))


def test_damaged_latest_falls_back_and_resumes_exactly(run_copy, base_run):
    """A flipped bit in the weights resumed silently before. Every other damage case:
    tests/checkpoint/test_resume.py."""
    _flip(run_copy / "checkpoints" / "step_8" / "model.safetensors")
    for name in (MANIFEST, "trained_on.json"):  # and an old checkpoint, saved before either file existed
        (run_copy / "checkpoints" / "step_6" / name).unlink()
    r = ok(yx_here("train", *FAST, "--max_steps", "8", "--checkpoint_freq", "2", "--keep_last", "10",
                   "--output_dir", run_copy, "--resume", "latest"))
    warn = [line for line in r.stdout.splitlines() if "is damaged" in line]
    assert len(warn) == 1 and "step_8" in warn[0] and "resuming from step_6" in warn[0], r.stdout[-2000:]
    assert sum("no manifest.json" in line for line in r.stdout.splitlines()) == 1
    assert "resumed from" in r.stdout and "step_6 at step 6" in r.stdout
    assert [losses(run_copy)[s] for s in (7, 8)] == [losses(base_run)[s] for s in (7, 8)]  # bit-identical


def test_explicitly_named_or_all_damaged_is_one_line_exit_2(run_copy):
    step8 = run_copy / "checkpoints" / "step_8"
    (step8 / "model.safetensors").unlink()
    r = yx_here("train", *FAST, "--max_steps", "10", "--output_dir", run_copy, "--resume", step8)
    one_line(r, 2, "damaged checkpoint (model.safetensors missing)")
    (run_copy / "checkpoints" / "latest").write_bytes(b"\x00\x81\xfe\xff")
    for d in (run_copy / "checkpoints").glob("step_[2-6]"):
        (d / "trainer_state.json").write_text("not json")
    listing = ok(yx_here("checkpoints", run_copy)).stdout
    assert listing.count("DAMAGED") == 4 and "warning: 'latest' pointer is not text" in listing, listing


def test_a_refused_resume_leaves_the_runs_config_and_files_as_they_were(run_copy):
    """A resume refused after setup (another preset: the weights do not fit; other data settings) wrote its own
    config.yaml over the run's before: the run directory then described a model its checkpoints are not."""
    before = {f: f.read_bytes() for f in run_copy.rglob("*") if f.is_file() and f.name != ".yxanul.lock"}
    for flags, needle in ((["--model", "tiny"], "its weights do not fit this model"),
                          (["--seq_length", "16"], "trained on other data settings")):
        r = yx_here("train", *FAST, "--max_steps", "10", "--output_dir", run_copy, "--resume", "latest", *flags)
        one_line(r, 2, needle)
    after = {f: f.read_bytes() for f in run_copy.rglob("*") if f.is_file() and f.name != ".yxanul.lock"}
    assert after == before


def test_a_resume_that_changes_the_batch_warns_with_the_flag_that_keeps_it(run_copy, tmp_path):
    """Another world size or micro-batch without a batch target changes the tokens of an optimizer step (the LR
    schedule was tuned for the run's): one warning naming the flag; with that flag the accumulation adapts."""
    import shutil

    keep, same_val = tmp_path / "keep", tmp_path / "same_val"
    shutil.copytree(run_copy, keep)
    shutil.copytree(run_copy, same_val)
    r = ok(yx_here("train", *FAST, "--max_steps", "9", "--micro_batch_size", "2", "--output_dir", run_copy,
                   "--resume", "latest"))
    assert ("warning: this resume changes the batch: 128 -> 64 tokens per optimizer step (no batch target keeps "
            "it); to train on with the run's batch, resume with --target_tokens_per_step 128") in r.stdout, r.stdout
    r = ok(yx_here("train", *FAST, "--max_steps", "9", "--micro_batch_size", "2", "--target_tokens_per_step", "128",
                   "--output_dir", keep, "--resume", "latest"))
    assert "changes the batch" not in r.stdout and "tokens_per_step" not in r.stdout.split("resumed from")[1][:200]
    # the batch is kept, but the validation set (eval_steps micro-batches) shrank with the micro-batch: said
    assert ("warning: this resume evaluates on 4 validation sequences, the run's earlier evaluations on 8 "
            "(eval_steps x micro_batch_size): val losses before and after it, and `best`, compare different sets; "
            "--eval_steps 4 keeps it") in r.stdout, r.stdout
    r = ok(yx_here("train", *FAST, "--max_steps", "9", "--micro_batch_size", "2", "--target_tokens_per_step", "128",
                   "--eval_steps", "4", "--output_dir", same_val, "--resume", "latest"))
    assert "validation sequences" not in r.stdout


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("name", ["optimizer.bin"])
def test_pickle_payload_is_refused_even_with_a_matching_manifest(run_copy, tmp_path, name):
    """Through the CLI; every file resume unpickles, in process: tests/checkpoint/test_io.py. An attacker who
    also rewrites the manifest still runs no code."""
    ckpt = run_copy / "checkpoints" / "step_8"
    marker = tmp_path / "pwned"
    torch.save({"state": _Payload(marker), "param_groups": []}, ckpt / name)
    write_manifest(ckpt, lambda p, text: p.write_text(text))
    r = yx_here("train", *FAST, "--max_steps", "9", "--output_dir", run_copy, "--resume", ckpt)
    one_line(r, 2, "holds a pickle that would run code; refused")
    assert not marker.exists()
    assert json.loads((ckpt / MANIFEST).read_text())["files"][name]["size"] == (ckpt / name).stat().st_size
