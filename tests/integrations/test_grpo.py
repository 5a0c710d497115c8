"""`yxanul grpo`: MedQA-shaped QA data, prompts and rewards (fast), a real one-step GRPO through TRL (fast),
and SFT then GRPO raising the reward on a fixed seed (slow)."""

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

from yxanul.cli import main as cli
from yxanul.finetune.qa import (
    answer_reward,
    format_reward,
    load_qa,
    parse_answer,
    prompt_of,
)

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("trl")


def test_parse_answer_reads_the_leading_letter():
    assert [parse_answer(c) for c in (" B", " B. Iron deficiency", "(C) Folate", "  D) x", "A:", " B\n")] == \
        ["B", "B", "C", "D", "A", "B"]
    assert [parse_answer(c) for c in (" Because", " iron", "", " The answer is B", " 42", " A 45-year-old man",
                                      " A patient with", " I think B")] == [None] * 8


def test_rewards_score_format_and_answer():
    opts = [{"A": "x", "B": "y", "C": "z", "D": "w"}] * 4
    completions = [" B. y", " Because", " C", " E"]
    assert format_reward(completions, options=opts) == [1.0, 0.0, 1.0, 0.0]  # E is not an option
    assert answer_reward(completions, answer_idx=["B", "B", "B", "D"], options=opts) == [1.0, 0.0, 0.0, 0.0]
    three = [{"A": "x", "B": "y", "C": "z", "D": None}]  # a missing option of a struct column is not one
    assert format_reward([" D"], options=three) == [0.0]


def test_bundled_set_has_medqa_columns_and_the_pretraining_layout():
    """32 items, balanced letters; prompt + SFT target is the seed-004 pretraining document of the row, so a
    model pretrained on MedQA documents meets the same layout; every prompt fits the default run's 128
    positions with 8 completion tokens (bundled tokenizer)."""
    from transformers import AutoTokenizer

    from yxanul.data.sources import BUNDLED_TOKENIZER
    from yxanul.data.template import render

    ds = load_qa("usmle_mini")
    assert len(ds) == 32 and sorted(ds["answer_idx"]) == sorted("ABCD" * 8)
    cfg = yaml.safe_load((ROOT / "examples/configs/seed004_xlarge_mixture.yaml").read_text())
    template = next(d["text_template"] for d in cfg["datasets"] if d["path"] == "GBaker/MedQA-USMLE-4-options")
    tok = AutoTokenizer.from_pretrained(str(BUNDLED_TOKENIZER))
    for row in ds:
        assert prompt_of(row) + f" {row['answer_idx']}. {row['answer']}" == render(template, row)
        assert len(tok(prompt_of(row)).input_ids) + 8 <= 128


def test_bad_dataset_and_flags_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q?", "options": {"A": "x", "B": "y"}, "answer_idx": "C"}) + "\n")
    cases = [
        (["grpo", str(tmp_path), "--dataset", str(bad)], "row 0"),
        (["grpo", str(tmp_path), "--dataset", "GBaker/MedQA-USMLE-4-options"], "Hub"),  # offline here
        (["grpo", str(tmp_path), "--batch_size", "6", "--num_generations", "4"], "batch_size"),
        (["grpo", str(tmp_path), "--num_generations", "1"], "num_generations"),
        (["grpo", str(tmp_path), "--lora_r", "-1"], "lora_r"),
        (["grpo", str(tmp_path), "--lora_r", "8", "--lora_alpha", "0"], "lora_alpha"),
    ]
    for argv, word in cases:
        assert cli(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and word in err[0], (argv, err)


def test_without_trl_grpo_is_one_line_naming_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # what find_spec and import see when it is not installed
    assert cli(["grpo", str(tmp_path)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert 'yxanul grpo needs trl, which is not installed: pip install "yxanul[grpo]"' in line, line
    assert not (tmp_path / "grpo").exists()


@pytest.fixture(scope="module")
def qa_run(tmp_path_factory):
    """A nano run at seq_length 128 (the default run's) with the bundled tokenizer's prepared data."""
    from hub.helpers import PRESET, save_run

    from yxanul.data.args import DataArgs
    from yxanul.data.prepare import prepare
    from yxanul.models import YxanulConfig, YxanulForCausalLM
    from yxanul.models.presets import PRESETS

    base = tmp_path_factory.mktemp("qa")
    data = prepare(DataArgs(data_dir=str(base / "data"), max_documents=20, val_fraction=0.1), progress=False,
                   say=lambda *a, **k: None)
    torch.manual_seed(0)
    cfg = YxanulConfig(**PRESETS[PRESET], vocab_size=8192, backend="torch", max_position_embeddings=128)
    run = base / "run"
    save_run(YxanulForCausalLM(cfg).eval(), run, te_views=False, data_dir=data, seq_length=128)
    return run


def _rows(out, stage):
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["stage"] == stage]


def test_one_grpo_step_through_trl_saves_a_transformers_model(qa_run, tmp_path, recwarn):
    """The real pipeline at its smallest: run -> in-memory Llama -> TRL GRPOTrainer (1 step) -> OUT/model,
    without the libraries' gradient_checkpointing rename warnings (TRL uses the old names)."""
    from transformers import AutoModelForCausalLM

    from yxanul.finetune.grpo import GrpoCommand, grpo

    out = tmp_path / "g"
    s = grpo(GrpoCommand(model=str(qa_run), limit=4, max_steps=1, batch_size=4, num_generations=2,
                         max_completion_length=2, output_dir=str(out), device="cpu"), say=lambda *a: None)
    assert not [w for w in recwarn if "gradient_checkpointing" in str(w.message)]
    (row,) = [r for r in _rows(out, "grpo") if "reward" in r]
    assert {"rewards/format_reward/mean", "rewards/answer_reward/mean"} <= set(row)
    assert s["steps"] == 1 and json.loads((out / "grpo_summary.json").read_text())["questions"] == 4
    model = AutoModelForCausalLM.from_pretrained(str(out / "model"))
    assert type(model).__name__ == "LlamaForCausalLM" and (out / "model" / "tokenizer.json").is_file()
    from yxanul.errors import UserError
    from yxanul.tools.compare import read_run

    with pytest.raises(UserError, match="metrics of `yxanul grpo`"):  # not a pretraining curve compared as one
        read_run(out)


def test_lora_trains_only_adapters_and_model_holds_the_merged_weights(qa_run, tmp_path):
    """--lora_r: SFT and GRPO train PEFT adapters on every linear layer; OUT/model is the merged model (plain
    transformers, no adapter keys): the projections moved, the embedding (no adapter) did not."""
    from transformers import AutoModelForCausalLM

    from yxanul.finetune.grpo import GrpoCommand, grpo
    from yxanul.integrations.causal_lm import load_causal_lm

    out = tmp_path / "g"
    s = grpo(GrpoCommand(model=str(qa_run), limit=4, sft_steps=1, max_steps=1, batch_size=4, num_generations=2,
                         max_completion_length=2, lora_r=4, output_dir=str(out), device="cpu"), say=lambda *a: None)
    base, _ = load_causal_lm(str(qa_run))
    assert 0 < s["trainable_parameters"] < base.num_parameters() / 10  # adapters only
    merged = AutoModelForCausalLM.from_pretrained(str(out / "model")).state_dict()
    assert not [k for k in merged if "lora" in k]
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged[q], base.state_dict()[q])  # the SFT step moved the adapter, merged in
    assert torch.equal(merged["model.embed_tokens.weight"], base.state_dict()["model.embed_tokens.weight"])


def test_too_few_questions_for_a_step_and_a_file_as_output_dir_are_one_line(qa_run, tmp_path, capsys):
    """TRL's sampler yields no batch from fewer prompts than a step takes: it ran 0 steps and said done."""
    (tmp_path / "f").write_text("x")
    cases = [(["--limit", "3", "--output_dir", str(tmp_path / "g")], "3 questions, fewer than the 4 prompts of a step "
                                                                     "(--batch_size 16 / --num_generations 4)"),
             (["--output_dir", str(tmp_path / "f" / "sub")], f"'{tmp_path / 'f'}' is a file, not a folder"),
             # 128 positions, 120 of them for the completion: no bundled prompt fits in the 8 left
             (["--max_completion_length", "120", "--output_dir", str(tmp_path / "g")],
              "every prompt is longer than 8 tokens (the model's max_position_embeddings minus "
              "--max_completion_length)")]
    for argv, needle in cases:
        assert cli(["grpo", str(qa_run), "--device", "cpu", "--max_steps", "1", *argv]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], (argv, err)
    assert not (tmp_path / "g").exists()


def test_a_completion_as_long_as_the_models_positions_and_limit_0_are_one_line_naming_the_field(qa_run, tmp_path,
                                                                                                   capsys):
    """--max_completion_length >= the model's 128 positions left a negative prompt budget ("every prompt is longer
    than -72 tokens"); --limit 0 was "a non-negative integer", which 0 is: each is one line naming the field."""
    expected = "fewer tokens than the model's 128 positions (max_position_embeddings), which hold the prompt too"
    cases = [(["--max_completion_length", "200"], f"config key 'max_completion_length': expected {expected}, got 200"),
             (["--max_completion_length", "128"], f"config key 'max_completion_length': expected {expected}, got 128"),
             (["--limit", "0"], "config key 'limit': expected an integer >= 1, got 0"),
             (["--sft_steps", "-1"], "config key 'sft_steps': expected an integer >= 0 (0: no SFT), got -1")]
    for argv, line in cases:
        assert cli(["grpo", str(qa_run), "--device", "cpu", "--max_steps", "1", "--output_dir", str(tmp_path / "g"),
                    *argv]) == 2, argv
        assert capsys.readouterr().err.strip().splitlines() == [f"error: {line}"], argv
    assert not (tmp_path / "g").exists()


def test_overwrite_never_deletes_a_run_or_its_checkpoints(qa_run, tmp_path, capsys):
    """--overwrite deletes output_dir first: the MODEL's run, its checkpoints folder or one checkpoint, another run
    directory and a folder above the MODEL are refused in one line before anything loads, every file intact."""
    import shutil

    other = tmp_path / "other"
    shutil.copytree(qa_run, other)
    ckpts = qa_run / "checkpoints"
    step = next(p for p in ckpts.iterdir() if p.name.startswith("step_"))
    before = {f: f.read_bytes() for root in (qa_run, other) for f in root.rglob("*") if f.is_file()}
    for model, out, needle in [(qa_run, qa_run, "would overwrite the MODEL"), (qa_run, other, "a run directory"),
                               (step, ckpts, "would overwrite the MODEL"), (qa_run, ckpts, "inside the run"),
                               (step, qa_run.parent, "would overwrite the MODEL")]:
        assert cli(["grpo", str(model), "--device", "cpu", "--max_steps", "1", "--output_dir", str(out),
                    "--overwrite"]) == 2, (model, out)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: output_dir '{out}': ") and needle in err[0], err
    assert {f: f.read_bytes() for root in (qa_run, other) for f in root.rglob("*") if f.is_file()} == before


def test_overwrite_replaces_only_an_earlier_grpo_output(qa_run, tmp_path, capsys):
    """A non-empty output_dir that is no earlier `yxanul grpo` output (no grpo_summary.json on top: a folder
    holding runs, a home-like folder) is refused in one line with --overwrite, every file intact; an earlier one
    (grpo_summary.json, model/ below it) is replaced."""
    import shutil

    shutil.copytree(qa_run, tmp_path / "runs" / "a")
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    (tmp_path / "home" / ".ssh" / "id").write_text("key")
    for out in (tmp_path / "runs", tmp_path / "home"):
        before = {f: f.read_bytes() for f in out.rglob("*") if f.is_file()}
        assert cli(["grpo", str(qa_run), "--device", "cpu", "--max_steps", "1", "--output_dir", str(out),
                    "--overwrite"]) == 2, out
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: output_dir '{out}': not an earlier `yxanul grpo` "
                                                   "output"), err
        assert {f: f.read_bytes() for f in out.rglob("*") if f.is_file()} == before
    out = tmp_path / "g"
    argv = ["grpo", str(qa_run), "--device", "cpu", "--limit", "4", "--max_steps", "1", "--batch_size", "4",
            "--num_generations", "2", "--max_completion_length", "2", "--output_dir", str(out)]
    assert cli(argv) == 0 and (out / "model").is_dir()
    (out / "model" / "stale.bin").write_bytes(b"x")
    assert cli([*argv, "--overwrite"]) == 0
    assert (out / "grpo_summary.json").is_file() and not (out / "model" / "stale.bin").exists()


@pytest.mark.slow
def test_sft_then_grpo_raises_the_reward(qa_run, tmp_path):
    """SFT teaches the letter format partly; GRPO (format + answer rewards) then raises the mean reward.
    The random-weight base puts ~4/8192 of its mass on a letter (reward 0 in almost every group: nothing for
    GRPO to learn), hence SFT."""
    from yxanul.finetune.grpo import GrpoCommand, grpo

    out = tmp_path / "g"
    s = grpo(GrpoCommand(model=str(qa_run), sft_steps=24, max_steps=16, learning_rate=2e-4, batch_size=16,
                         num_generations=4, max_completion_length=2, output_dir=str(out), device="cpu"),
             say=lambda *a: None)
    assert len(_rows(out, "sft")) >= 24
    # `yxanul grpo` with these settings on this seed: first 4 steps 0.578 -> last 4 steps 0.750 (of 2)
    assert s["steps"] == 16 and s["reward_last"] > s["reward_first"], s
