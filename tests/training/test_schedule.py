"""Sequence-length curriculum: validation, stage selection by step or tokens, constant tokens/step,
LR continuous over tokens, and a real training run through stages with resume."""

import json
import os
import subprocess
import sys

import pytest

from yxanul.errors import ConfigError
from yxanul.tracking import read_metrics
from yxanul.training.batching import fp8_micro_multiple, plan_batch
from yxanul.training.schedule import Curriculum, same_tokens_micro

STAGES = [{"seq_length": 64, "until_tokens": 1000}, {"seq_length": 128, "until_steps": 20}, {"seq_length": 256}]


def test_stages_boundaries_and_selection():
    cur = Curriculum.from_config(STAGES, tokens_per_step=512)  # 1000 tokens -> first whole step past it: 2
    assert cur.max_seq_length == 256
    assert [(s.start_step, s.end_step) for s in cur.stages] == [(0, 2), (2, 20), (20, None)]
    assert [s.sequences_per_step for s in cur.stages] == [8, 4, 2]
    assert cur.stages[0].end_tokens == 1024
    assert [cur.stage_at(s)[0] for s in (0, 1, 2, 19, 20, 10_000)] == [0, 0, 1, 1, 2, 2]
    # resume: the stage is a pure function of the step / tokens in the checkpoint
    for step in range(60):
        assert cur.stage_at(step) == cur.stage_at(tokens_seen=step * 512)
        assert cur.stage_at(tokens_seen=step * 512 + 511) == cur.stage_at(step)
    closed = Curriculum.from_config([{"seq_length": 64, "until_steps": 5}, {"seq_length": 128, "until_steps": 9}], 256)
    assert closed.stages[0].end_step == 5 and closed.stage_at(100)[0] == 1  # past the last boundary: last stage
    with pytest.raises(TypeError):
        cur.stage_at()


@pytest.mark.parametrize("stages,needle", [
    ([], "non-empty"),
    ("256", "non-empty"),
    ([{"seq_length": 64}, {"seq_length": 128}], "only the last stage"),
    ([{"seq_length": 64, "until_steps": 10}, {"seq_length": 128, "until_steps": 5}], "strictly increasing"),
    ([{"seq_length": 64, "until_steps": 10}, {"seq_length": 128, "until_tokens": 640}], "strictly increasing"),
    ([{"seq_length": 1, "until_steps": 10}], "seq_length an integer >= 2"),
    ([{"seq_length": True}], "seq_length an integer"),
    ([{"seq_length": 64, "until_steps": 0}], "until_steps a positive integer"),
    ([{"seq_length": 64, "until_tokens": "lots"}], "until_tokens a positive integer"),
    ([{"seq_length": 64, "until_steps": 10, "until_tokens": 5}], "not both"),
    ([{"seq_len": 64}], "keys"),
    ([{"seq_length": 96, "until_steps": 10}, {"seq_length": 128}], "multiple of 384"),
    ([{"seq_length": 2048}], "the model's 1024"),
])
def test_validation_errors(stages, needle):
    with pytest.raises(ConfigError, match=needle):
        Curriculum.from_config(stages, tokens_per_step=256 * 16, max_seq_length=1024)


def test_float_boundaries_from_yaml_are_accepted():
    cur = Curriculum.from_config([{"seq_length": 64, "until_tokens": 2.0e5}, {"seq_length": 128}], 1024)
    assert [s.end_step for s in cur.stages[:-1]] == [196]


def test_yaml_numbers_read_as_strings_are_read_like_any_integer_key(tmp_path):
    """YAML 1.1 reads `2e5` (no dot) and `200_000` as strings; max_steps takes them, so a stage does too."""
    from yxanul.config_file import load_yaml  # the YAML reader train --config uses
    (tmp_path / "c.yaml").write_text("curriculum:\n  - {seq_length: 64, until_tokens: 2e5}\n"
                                     "  - {seq_length: 128, until_steps: 300_000}\n  - {seq_length: 256}\n")
    stages = load_yaml(str(tmp_path / "c.yaml"))["curriculum"]
    assert isinstance(stages[0]["until_tokens"], str)
    cur = Curriculum.from_config(stages, 1024)
    assert [s.end_step for s in cur.stages[:-1]] == [196, 300_000]


def test_tokens_per_step_constant_across_stages():
    for tokens in (8 * 2048, 65536, 3 * 4096):
        cur = Curriculum.from_config([{"seq_length": T, "until_steps": 10 * (i + 1)} for i, T in
                                      enumerate((128, 256, 512, 1024))] + [{"seq_length": 2048}], tokens)
        for world in (1, 2, 4):
            for base_micro in (1, 3, 8):
                plans = cur.plan_stages(same_tokens_micro(base_micro, 2048), world)
                for s, bp in zip(cur.stages, plans, strict=True):
                    assert bp.seq_length == s.seq_length
                    if (tokens // s.seq_length) % world == 0:
                        assert bp.tokens_per_step == tokens and bp.warning is None
                        assert bp.effective_batch == tokens // s.seq_length
                        assert bp.micro_batch <= max(1, base_micro * 2048 // s.seq_length)
                    else:
                        assert "%" in bp.warning
    # a micro-batch multiple per stage (e.g. FP8) is respected
    cur = Curriculum.from_config([{"seq_length": 96, "until_steps": 3}, {"seq_length": 192}], 96 * 192)
    plans = cur.plan_stages(lambda T: 40, 1, multiple=fp8_micro_multiple)
    assert all(bp.micro_batch * bp.seq_length % 16 == 0 and bp.tokens_per_step == 96 * 192 for bp in plans)
    assert plan_batch(4, 2, 256, target_tokens_per_step=4096).tokens_per_step == 4096


def test_training_through_stages_and_resume(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("curriculum:\n  - {seq_length: 16, until_steps: 6}\n  - {seq_length: 32}\n")
    common = ["--config", str(cfg), "--model", "nano", "--backend", "torch", "--seq_length", "32",
              "--micro_batch_size", "2", "--log_freq", "1", "--eval_freq", "0", "--eval_steps", "2",
              "--sample_tokens", "0", "--use_tensorboard", "false", "--num_workers", "0", "--lr_decay_steps", "12",
              "--warmup_steps", "2", "--checkpoint_freq", "4", "--keep_last", "5"]
    env = dict(os.environ, HF_HUB_OFFLINE="1")

    def run(out, *a):
        r = subprocess.run([sys.executable, "-m", "yxanul", "train", *common, "--output_dir", str(out), *a],
                           capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stdout

    out = run(tmp_path / "full", "--max_steps", "12")
    assert "curriculum stage 0: seq_length 16, micro 4 x accumulation 1" in out
    assert "curriculum stage 1: seq_length 32, micro 2 x accumulation 1" in out
    rows = [r for r in read_metrics(tmp_path / "full" / "metrics.jsonl") if "loss" in r]
    assert [r["seq_length"] for r in rows] == [16] * 6 + [32] * 6
    assert [r["epoch"] for r in rows] == [0] * 12  # the stages share one chunk order: the pass goes on
    assert [r["tokens_seen"] for r in rows] == [64 * s for s in range(1, 13)]  # 64 tokens every step
    # resume from step 4 (inside stage 0) across the boundary: same losses as the uninterrupted run
    out = run(tmp_path / "part", "--max_steps", "12", "--resume", str(tmp_path / "full" / "checkpoints" / "step_4"))
    assert out.index("curriculum stage 0") < out.index("curriculum stage 1")
    a = {r["step"]: r["loss"] for r in rows}
    b = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "part" / "metrics.jsonl") if "loss" in r}
    assert sorted(b) == list(range(5, 13)) and max(abs(a[s] - b[s]) for s in b) <= 1e-5
    state = json.loads((tmp_path / "part" / "checkpoints" / "step_12" / "trainer_state.json").read_text())
    assert state["data"]["seq_length"] == 32


def test_a_stage_length_that_does_not_divide_the_runs_is_one_warning_at_start():
    """Such a stage reads its own window grid: the stage change into or out of it starts the next epoch (the rest of
    the current one is not read). Said once when the curriculum is planned; stages that divide say nothing."""
    from yxanul.config import resolve
    from yxanul.training.batching import plan_curriculum, resolve_batch

    def said(stages, seq_length=48):
        cfg = resolve({"curriculum": stages, "seq_length": seq_length, "micro_batch_size": 4,
                       "target_tokens_per_step": 384})
        lines = []
        batch = resolve_batch(cfg.batch, seq_length=seq_length, world_size=1, say=lines.append)
        plan_curriculum(cfg, batch, batch.tokens_per_step, 1, lines.append)
        return [line for line in lines if line.startswith("warning: curriculum")]

    assert said([{"seq_length": 32, "until_steps": 4}, {"seq_length": 48}]) == [
        "warning: curriculum stage 0: seq_length 32 does not divide the run's seq_length 48: the stage change out of "
        "it starts the next epoch (the rest of the current one is not read); stage lengths dividing 48 share one "
        "pass (e.g. 24 or 48)"]
    middle = said([{"seq_length": 16, "until_steps": 2}, {"seq_length": 32, "until_steps": 4}, {"seq_length": 48}])
    assert len(middle) == 1 and middle[0].startswith("warning: curriculum stage 1: seq_length 32 does not divide the "
                                                     "run's seq_length 48: the stage change into or out of it starts")
    assert said([{"seq_length": 16, "until_steps": 2}, {"seq_length": 24, "until_steps": 4}, {"seq_length": 48}]) == []


def test_a_stage_that_starts_after_max_steps_is_one_warning_at_start():
    """A stage boundary at or past max_steps leaves the later stages unrun: their seq_length is never trained, and
    nothing said so. One line per such stage when the curriculum is planned; stages the run reaches say nothing."""
    from yxanul.config import resolve
    from yxanul.training.batching import plan_curriculum, resolve_batch

    def said(stages, max_steps):
        cfg = resolve({"curriculum": stages, "seq_length": 32, "micro_batch_size": 4, "max_steps": max_steps,
                       "target_tokens_per_step": 256})
        lines = []
        batch = resolve_batch(cfg.batch, seq_length=32, world_size=1, say=lines.append)
        plan_curriculum(cfg, batch, batch.tokens_per_step, 1, lines.append)
        return [line for line in lines if line.startswith("warning: curriculum")]

    stages = [{"seq_length": 16, "until_steps": 10}, {"seq_length": 32, "until_steps": 20}, {"seq_length": 32}]
    assert said(stages, 10) == [
        "warning: curriculum stage 1 (seq_length 32) starts at step 11, after max_steps 10: it never runs (end the "
        "stages before it earlier, or raise max_steps)",
        "warning: curriculum stage 2 (seq_length 32) starts at step 21, after max_steps 10: it never runs (end the "
        "stages before it earlier, or raise max_steps)"]
    assert len(said(stages, 15)) == 1 and said(stages, 21) == []
