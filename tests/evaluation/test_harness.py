"""`yxanul eval --tasks NAME` and `--eval_tasks NAME` through lm-eval's simple_evaluate on the model in memory,
offline, with local task YAMLs (lm-eval's include_path) over local json files."""

import pytest
import torch

from yxanul.evaluation.run import EvalCommand, evaluate

pytest.importorskip("lm_eval")

# a built-in-like task whose data is on the Hub: offline it must fail in one line
HUB_YAML = """
task: hub_only
dataset_path: allenai/ai2_arc
dataset_name: ARC-Easy
test_split: test
output_type: multiple_choice
doc_to_text: "{{question}}"
doc_to_target: "{{choices.label.index(answerKey)}}"
doc_to_choice: "{{choices.text}}"
"""


@pytest.fixture
def task_dir(cloze_task_dir):
    (cloze_task_dir / "hub_only.yaml").write_text(HUB_YAML)
    return cloze_task_dir


def test_as_llama_is_the_same_model(tok_run):
    """The in-memory Llama the tools get computes the native model's logits (fp32: summation order only)."""
    from yxanul.integrations.causal_lm import as_llama

    _, model = tok_run
    llama = as_llama(model)
    assert type(llama).__name__ == "LlamaForCausalLM"
    x = torch.randint(0, 8192, (2, 24))
    torch.testing.assert_close(llama(input_ids=x).logits, model(input_ids=x).logits, atol=1e-5, rtol=1e-5)


def test_eval_by_name_runs_lm_eval_on_the_run_in_memory(tok_run, task_dir):
    """A run (no export) scored by lm-eval by task name: the same items give yxanul's own acc / acc_norm."""
    run, _ = tok_run
    lines = []
    r = evaluate(EvalCommand(model=str(run), tasks=["cloze,yxanul_cloze"], task_dir=str(task_dir), limit=6),
                 say=lines.append)
    assert r["yxanul_cloze"]["n"] == 6 == r["cloze"]["n"]
    assert r["yxanul_cloze"]["acc"] == pytest.approx(r["cloze"]["acc"])
    assert r["yxanul_cloze"]["acc_norm"] == pytest.approx(r["cloze"]["acc_norm"])
    assert "acc_stderr" in r["yxanul_cloze"]
    assert any(line.startswith("yxanul_cloze: ") and "(lm-eval)" in line for line in lines)


def test_eval_hub_task_offline_is_one_line(tok_run, task_dir, capsys):
    from yxanul.cli import main as cli

    run, _ = tok_run
    code = cli(["eval", str(run), "--tasks", "hub_only", "--task_dir", str(task_dir), "--limit", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "Hub" in err[0] and "--task_dir" in err[0], err
    assert "dataset 'allenai/ai2_arc' is not in the HF cache and the Hub cannot be asked" in err[0], err[0]


def test_an_unreachable_hub_means_the_hf_cache_at_once_not_retries(tok_run, task_dir, tmp_path):
    """Not offline mode, but no route to the Hub (an air-gapped node): one TCP probe, HF_DATASETS_OFFLINE for
    the run (said in one line), then the task's dataset from the cache or one error line; no retry loop."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"))  # discard port: refused at once
    r = subprocess.run([sys.executable, "-m", "yxanul", "eval", str(tok_run[0]), "--tasks", "hub_only", "--task_dir",
                        str(task_dir), "--limit", "2"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "the Hugging Face Hub is unreachable (127.0.0.1: " in r.stdout, r.stdout
    assert "lm-eval's datasets come from the HF cache only (HF_DATASETS_OFFLINE=1 for this run)" in r.stdout
    [line] = [x for x in r.stderr.splitlines() if x.startswith("error: ")]
    assert "dataset 'allenai/ai2_arc' is not in the HF cache" in line and "Retrying" not in r.stderr + r.stdout


def test_a_misspelt_bundled_task_suggests_it_first(tok_run, capsys):
    from yxanul.cli import main as cli

    assert cli(["eval", str(tok_run[0]), "--tasks", "clozee"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "task 'clozee'" in err[0] and "did you mean 'cloze'?" in err[0], err


def test_without_lm_eval_its_tasks_are_one_line_naming_the_extra(tok_run, capsys, monkeypatch):
    import sys

    from yxanul.cli import main as cli

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # what find_spec and import see when it is not installed
    assert cli(["eval", str(tok_run[0]), "--tasks", "arc_easy", "cloze"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "--tasks arc_easy (lm-eval's) needs lm-eval, which is not installed: pip install \"yxanul[eval]\"" in line


def test_a_benchmark_named_by_its_family_suggests_the_task_not_a_nearer_spelling():
    """The seeds' `--tasks medqa,arc`: the nearest of lm-eval's names would be other benchmarks (medmcqa, arc_zh)."""
    from yxanul.evaluation.harness import _hint

    tasks = ["medmcqa", "arc_zh", "arc_easy", "arc_challenge", "medqa_4options", "hellaswag"]
    assert _hint("medqa", tasks) == "did you mean 'medqa_4options'?"
    assert _hint("arc", tasks) == "did you mean 'arc_easy' or 'arc_challenge'?"
    assert _hint("hellaswg", tasks) == "did you mean 'hellaswag'?"


def test_eval_task_dir_must_exist(tok_run, tmp_path, capsys):
    from yxanul.cli import main as cli

    run, _ = tok_run
    assert cli(["eval", str(run), "--tasks", "x_task", "--task_dir", str(tmp_path / "nope")]) == 2
    assert "task_dir" in capsys.readouterr().err


def test_eval_tasks_callback_takes_lm_eval_names(tok_run, task_dir):
    """--eval_tasks during training: lm-eval names next to yxanul's own, logged as eval/<task>_<metric>."""
    from yxanul.evaluation.args import EvalTaskArgs
    from yxanul.evaluation.tasks import EvalTasksCallback
    from yxanul.hub.loading import load_model

    run, _ = tok_run
    model, tok = load_model(run)
    model.train()
    cb = EvalTasksCallback(EvalTaskArgs(eval_tasks=["cloze", "yxanul_cloze"], eval_task_dir=str(task_dir),
                                        eval_tasks_limit=5))
    out = cb.evaluate(model, tok, "cpu")
    assert model.training  # given back in the mode it came in
    assert out["eval/yxanul_cloze_acc"] == pytest.approx(out["eval/cloze_acc"])
    assert out["eval/yxanul_cloze_acc_norm"] == pytest.approx(out["eval/cloze_acc_norm"])
    assert not any(k.endswith("_stderr") for k in out)
