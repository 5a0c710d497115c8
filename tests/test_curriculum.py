"""Sequence-length curriculum: validation, stage selection, constant tokens/step, training + resume."""

import json
import os
import subprocess
import sys

import pytest

from yxanul.batch_finder import plan_batch
from yxanul.curriculum import Curriculum
from yxanul.errors import ConfigError
from yxanul.tracking import read_metrics


def test_stages_and_boundaries():
    cur = Curriculum.from_config([{"seq_length": 64, "until_tokens": 1000}, {"seq_length": 128, "until_steps": 20},
                                  {"seq_length": 256}], tokens_per_step=100)
    assert cur.boundaries() == [10, 20]
    assert [cur.stage_at(s)[0] for s in (0, 9, 10, 19, 20, 10_000)] == [0, 0, 1, 1, 2, 2]
    assert cur.max_seq_length == 256


@pytest.mark.parametrize("stages,needle", [
    ([], "non-empty"),
    ([{"seq_length": 64}, {"seq_length": 128}], "only the last stage"),
    ([{"seq_length": 64, "until_steps": 10}, {"seq_length": 128, "until_steps": 5}], "strictly increasing"),
    ([{"seq_length": 1, "until_steps": 10}], "seq_length"),
    ([{"seq_length": 64, "until_steps": 10, "until_tokens": 5}], "not both"),
    ([{"seq_len": 64}], "keys"),
])
def test_validation_errors(stages, needle):
    with pytest.raises(ConfigError, match=needle):
        Curriculum.from_config(stages, tokens_per_step=100)


def test_tokens_per_step_constant_across_stages():
    tokens = 8 * 4 * 512
    for T in (128, 256, 512, 1024, 2048):
        bp = plan_batch(max(1, 8 * 512 // T), 4, T, target_tokens_per_step=tokens)
        assert bp.tokens_per_step == tokens and bp.warning is None


def test_training_through_stages_and_resume(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("curriculum:\n  - {seq_length: 16, until_steps: 6}\n  - {seq_length: 32}\n")
    common = ["--config", str(cfg), "--model", "tiny", "--seq_length", "32", "--micro_batch_size", "2",
              "--log_freq", "1", "--eval_freq", "0", "--eval_steps", "2", "--sample_tokens", "0",
              "--use_tensorboard", "false", "--num_workers", "0", "--lr_decay_steps", "12", "--warmup_steps", "2"]
    env = dict(os.environ, HF_HUB_OFFLINE="1")

    def run(out, *a):
        r = subprocess.run([sys.executable, "-m", "yxanul", "train", *common, "--output_dir", str(out), *a],
                           capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stdout

    out = run(tmp_path / "full", "--max_steps", "12", "--checkpoint_freq", "0")
    assert "curriculum stage 0: seq_length 16, micro 4 x accumulation 1" in out
    assert "curriculum stage 1: seq_length 32, micro 2 x accumulation 1" in out
    rows = [r for r in read_metrics(tmp_path / "full" / "metrics.jsonl") if "loss" in r]
    assert [r["seq_length"] for r in rows] == [16] * 6 + [32] * 6
    assert len({r["tokens_seen"] - i * 64 for i, r in enumerate(rows)}) == 1  # 64 tokens every step
    # resume in the middle of stage 0 and in stage 1 lands on the same losses
    run(tmp_path / "part", "--max_steps", "4", "--checkpoint_freq", "0")
    run(tmp_path / "part", "--max_steps", "9", "--checkpoint_freq", "0", "--resume", "latest")
    out = run(tmp_path / "part", "--max_steps", "12", "--checkpoint_freq", "0", "--resume", "latest")
    assert "curriculum stage 1" in out and "curriculum stage 0" not in out
    a = {r["step"]: r["loss"] for r in rows}
    b = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "part" / "metrics.jsonl") if "loss" in r}
    assert max(abs(a[s] - b[s]) for s in range(1, 13)) <= 1e-5
    state = json.loads((tmp_path / "part" / "checkpoints" / "step_12" / "trainer_state.json").read_text())
    assert state["data"]["seq_length"] == 32
