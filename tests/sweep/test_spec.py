"""The sweep files, trial planning and the `yxanul sweep` command line (fast: no training here)."""

import glob
import os
import sys

import pytest
import yaml

from yxanul.cli import main as cli_main
from yxanul.config import _fields
from yxanul.errors import UserError
from yxanul.sweep import SweepCommand, is_offline, split_argv
from yxanul.sweep.spec import load_spec, plan_trials, trial_flags
from yxanul.sweep.trial import launch_command, make_trial

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SWEEPS = sorted(glob.glob(os.path.join(ROOT, "sweeps", "*.yaml")))
TINY = os.path.join(ROOT, "sweeps", "penalty_weight_tinyshakespeare.yaml")
FINEWEB = os.path.join(ROOT, "sweeps", "penalty_weight_fineweb_edu.yaml")


def write(tmp_path, **doc):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(p)


@pytest.mark.parametrize("path", SWEEPS, ids=os.path.basename)
def test_sweep_files_are_wandb_format_over_real_config_keys(path):
    raw = yaml.safe_load(open(path))
    assert {"method", "metric", "parameters", "command"} <= set(raw)
    assert raw["metric"] == {"name": "eval/val_loss", "goal": "minimize"}
    assert "${args}" in raw["command"]  # where W&B's agent puts --key=value
    spec = load_spec(path)
    assert set(spec.parameters) <= set(_fields())
    for params in plan_trials(spec, 3):  # every planned trial resolves to a valid config
        make_trial(spec, "t", params, __import__("pathlib").Path("unused"), [])


def test_the_three_files_the_issue_asks_for():
    names = {os.path.basename(p) for p in SWEEPS}
    assert {"penalty_weight_tinyshakespeare.yaml", "penalty_weight_fineweb_edu.yaml"} <= names
    fw = load_spec(FINEWEB)
    assert fw.parameters["penalty_weight"]["values"] == [0.0, 0.005, 0.01, 0.02, 0.05]
    assert fw.parameters["use_fp8"] == {"value": True} and fw.parameters["dataset_name"] == {"value": "sample-10BT"}
    assert "fineweb-edu" in fw.parameters["dataset"]["value"] and fw.launcher[:2] == ["accelerate", "launch"]
    assert os.path.isfile(os.path.join(ROOT, fw.base_config()))
    searches = [load_spec(p) for p in SWEEPS if load_spec(p).method in ("random", "bayes")]
    assert any({"max_lr", "penalty_weight"} <= set(s.swept) for s in searches)
    tiny = load_spec(TINY)
    assert tiny.method == "grid" and tiny.swept == ["penalty_weight"] and len(plan_trials(tiny, None)) == 3


def test_grid_is_the_product_in_order_and_count_takes_the_first(tmp_path):
    spec = load_spec(write(tmp_path, method="grid", parameters={
        "max_lr": {"values": [1e-3, 2e-3]}, "penalty_weight": {"values": [0.0, 0.1, 0.2]},
        "max_steps": {"value": 5}}))
    trials = plan_trials(spec, None)
    assert len(trials) == 6 and trials[0] == {"max_lr": 1e-3, "penalty_weight": 0.0, "max_steps": 5}
    assert trials[-1] == {"max_lr": 2e-3, "penalty_weight": 0.2, "max_steps": 5}
    assert plan_trials(spec, 4) == trials[:4]
    assert trial_flags(trials[1]) == ["--max_lr=0.001", "--penalty_weight=0.1", "--max_steps=5"]


def test_random_is_reproducible_and_respects_distributions(tmp_path):
    spec = load_spec(write(tmp_path, method="random", parameters={
        "max_lr": {"distribution": "log_uniform_values", "min": 1e-4, "max": 1e-2},
        "warmup_steps": {"distribution": "int_uniform", "min": 1, "max": 9},
        "penalty_type": {"values": ["none", "z_loss"]}}))
    a, b, c = plan_trials(spec, 40, seed=1), plan_trials(spec, 40, seed=1), plan_trials(spec, 40, seed=2)
    assert a == b and a != c
    lrs = [t["max_lr"] for t in a]
    assert all(1e-4 <= x <= 1e-2 for x in lrs) and min(lrs) < 1e-3 < max(lrs)  # log-spread, not linear
    assert all(isinstance(t["warmup_steps"], int) and 1 <= t["warmup_steps"] <= 9 for t in a)
    assert {t["penalty_type"] for t in a} == {"none", "z_loss"}
    with pytest.raises(UserError, match="--count"):
        plan_trials(spec, None)


@pytest.mark.parametrize("doc, match", [
    ({"method": "grid", "parameters": {"penalty_wieght": {"values": [0.1]}}}, "did you mean 'penalty_weight'"),
    ({"method": "hyperband", "parameters": {"max_lr": {"value": 1e-3}}}, "method: expected one of grid"),
    ({"method": "grid", "parameters": {"max_lr": {"min": 1e-4, "max": 1e-3}}}, "grid needs `values`"),
    ({"method": "grid", "parameters": {"max_steps": {"values": ["many"]}}},
     "parameters.max_steps: config key 'max_steps': expected an integer"),
    ({"method": "random", "parameters": {"max_lr": {"values": [1e-3, 2e-3], "probabilities": [1.0]}}},
     "probabilities: expected one weight"),
    ({"method": "grid", "metric": {"name": "val_loss"}, "parameters": {"max_lr": {"value": 1e-3}}}, "metric.name"),
    ({"method": "grid", "command": ["python", "other.py"], "parameters": {"max_lr": {"value": 1e-3}}},
     "command: expected `yxanul train"),
    ({"method": "random", "parameters": {"max_lr": {"distribution": "uniform", "min": 1e-3}}},
     r"distribution uniform needs min <= max, got min 0.001, max None"),
    ({"method": "random", "parameters": {"max_lr": {"distribution": "log_uniform_values", "min": 0, "max": 1e-2}}},
     r"needs min > 0 \(a log scale\), got 0"),
    ({"method": "random", "parameters": {"max_lr": {"distribution": "q_uniform", "min": 1, "max": 2, "q": 0}}},
     r"parameters.max_lr.q: expected a number > 0, got 0"),
    ({"method": "random", "parameters": {"max_lr": {"distribution": "uniform", "min": "low", "max": 1}}},
     r"parameters.max_lr.min: expected a number, got 'low'"),
])
def test_bad_sweep_files_are_one_line_errors_with_exit_2(tmp_path, capsys, doc, match):
    path = write(tmp_path, **doc)
    with pytest.raises(UserError, match=match):
        plan_trials(load_spec(path), None)
    assert cli_main(["sweep", path, "--offline", "--output_root", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err


def test_argv_split_own_flags_from_trial_flags():
    own, rest = split_argv(["F.yaml", "--count", "3", "--max_steps", "3", "--offline", "--datasets_mix", "--seed=4"])
    assert own == ["F.yaml", "--count", "3", "--offline=true"]
    assert rest == ["--max_steps", "3", "--datasets_mix", "--seed=4"]
    own, rest = split_argv(["--max_steps", "20", "F.yaml", "--summary"])
    assert own == ["F.yaml", "--summary=true"] and rest == ["--max_steps", "20"]
    own, rest = split_argv(["F.yaml", "--offline", "--", "--max_steps", "20"])  # a `--` before the trial flags
    assert own == ["F.yaml", "--offline=true"] and rest == ["--max_steps", "20"]


def test_trial_overrides_win_and_swept_or_reserved_flags_are_refused(tmp_path):
    spec = load_spec(TINY)
    t = make_trial(spec, "trial-000", plan_trials(spec, 1)[0], tmp_path / "t", ["--max_steps", "7"])
    assert t.max_steps == 7 and t.params["max_steps"] == 150 and t.config["max_steps"] == 7
    assert t.argv[-6:] == ["--output_dir", str(tmp_path / "t"), "--run_name", "trial-000", "--resume", "auto"]
    base = os.path.join(ROOT, "examples", "configs", "tinyshakespeare_cpu.yaml")
    t = make_trial(spec, "x", plan_trials(spec, 1)[0], tmp_path, ["--config", base, "--seed", "3"])
    assert t.argv[:2] == ["--config", base] and t.argv.index("--seed") > t.argv.index("--penalty_weight=0.0")
    with pytest.raises(UserError, match="--penalty_weight is swept"):
        make_trial(spec, "x", plan_trials(spec, 1)[0], tmp_path, ["--penalty_weight", "0.5"])
    with pytest.raises(UserError, match="--output_dir is set by the sweep"):
        make_trial(spec, "x", plan_trials(spec, 1)[0], tmp_path, ["--output_dir", "elsewhere"])
    with pytest.raises(UserError, match="max_lr"):
        make_trial(spec, "x", plan_trials(spec, 1)[0], tmp_path, ["--max_lr", "fast"])
    with pytest.raises(UserError, match="^yxanul sweep: --config given twice"):  # the second was dropped
        make_trial(spec, "x", plan_trials(spec, 1)[0], tmp_path, ["--config", base, f"--config={base}"])


def test_accelerate_prefix_of_the_command_launches_every_rank(tmp_path):
    spec = load_spec(FINEWEB)
    t = make_trial(spec, "r1", plan_trials(spec, 1)[0], tmp_path / "r1", [])
    cmd = launch_command(spec, t)
    assert cmd[:6] == [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                       "accelerate_configs/single_gpu_fp8.yaml", "-m"]
    assert cmd[6:10] == ["yxanul", "train", "--config", "examples/configs/fineweb_edu_fp8.yaml"]
    assert "--penalty_weight=0.0" in cmd and "--use_fp8=True" in cmd  # flags: every rank parses them
    plain = launch_command(load_spec(TINY),
                           make_trial(load_spec(TINY), "x", {"max_steps": 3, "warmup_steps": 1}, tmp_path, []))
    assert plain[:4] == [sys.executable, "-m", "yxanul", "train"]


def test_offline_decision(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    args = SweepCommand(file=TINY)
    assert is_offline(args) == (True, "WANDB_MODE=offline")
    monkeypatch.delenv("WANDB_MODE")
    assert is_offline(args)[0] and "no W&B API key" in is_offline(args)[1]
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert is_offline(args) == (False, "")
    assert is_offline(SweepCommand(file=TINY, offline=True)) == (True, "--offline")


def test_sweep_id_offline_and_missing_file_are_user_errors(tmp_path, capsys):
    assert cli_main(["sweep", TINY, "--offline", "--sweep_id", "abc"]) == 2
    assert "--sweep_id needs W&B online" in capsys.readouterr().err
    assert cli_main(["sweep", str(tmp_path / "nope.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert cli_main(["sweep", TINY, "--summary", "--output_root", str(tmp_path)]) == 2
    assert "no sweep under" in capsys.readouterr().err


def test_a_rerun_with_other_settings_is_refused_in_one_line(tmp_path, capsys):
    """A trial that ran (its run directory holds the config.yaml the trainer wrote) is never continued under
    other settings: e.g. a 7-step trial rerun with the file's 150 steps would resume under a new schedule."""
    from yxanul.config import parse_args
    from yxanul.sweep.local import plan

    spec = load_spec(TINY)
    root, trials = plan(spec, str(tmp_path), ["--max_steps", "7"], 1, 0, say=lambda *_: None)
    t = trials[0]
    cfg = parse_args(["--config", os.path.join(ROOT, "yxanul", "assets", "default.yaml"), *t.argv])
    t.run_dir.mkdir(parents=True)
    cfg.save(t.run_dir / "config.yaml")  # what the trainer writes at its start
    assert plan(spec, str(tmp_path), ["--max_steps", "7"], 1, 0, say=lambda *_: None)[1][0].changed_settings() == []
    with pytest.raises(UserError, match=r"trial-000 ran with other settings \(max_steps: 7 -> 150\): run the sweep "
                                        r"with the same flags as before"):
        plan(spec, str(tmp_path), [], 1, 0, say=lambda *_: None)
    argv = ["sweep", TINY, "--offline", "--count", "1", "--output_root", str(tmp_path), "--max_lr", "1e-3"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "max_lr: " in err[0] and "-> 0.001" in err[0], err


def test_speed_flags_the_table_set_at_run_time_are_not_other_settings(tmp_path):
    """On a GPU the trainer writes the speed defaults it applied into config.yaml (loss_impl te, ...): a rerun of the
    sweep continues that trial (its resume keeps them). A speed flag the user gives is still compared."""
    from yxanul.config import parse_args
    from yxanul.sweep.local import plan

    spec = load_spec(TINY)
    t = plan(spec, str(tmp_path), ["--max_steps", "7"], 1, 0, say=lambda *_: None)[1][0]
    cfg = parse_args(["--config", os.path.join(ROOT, "yxanul", "assets", "default.yaml"), *t.argv])
    cfg.model.loss_impl, cfg.model.cuda_graphs = "te", True  # what a te-backend table entry sets
    t.run_dir.mkdir(parents=True)
    cfg.save(t.run_dir / "config.yaml")
    assert plan(spec, str(tmp_path), ["--max_steps", "7"], 1, 0, say=lambda *_: None)[1][0].changed_settings() == []
    with pytest.raises(UserError, match=r"ran with other settings \(loss_impl: 'te' -> 'chunked'\)"):
        plan(spec, str(tmp_path), ["--max_steps", "7", "--loss_impl", "chunked"], 1, 0, say=lambda *_: None)


def test_yaml_1_1_exponents_and_list_values_reach_the_trial_as_written(tmp_path):
    """``1e-4`` (no dot) is a string to YAML 1.1: a number all the same; a list value is one word per item (as a
    list flag reads it), so `eval_tasks` and `fp8_keep_bf16` get the list, not the string "['cloze']"."""
    path = tmp_path / "s.yaml"
    path.write_text("method: random\nparameters:\n  max_lr: {distribution: log_uniform_values, min: 1e-4, max: 1e-2}\n"
                    "  eval_tasks: {values: [[cloze], [cloze, cloze]]}\n"
                    "  fp8_keep_bf16: {value: ['model.layers.0.*']}\n")
    spec = load_spec(str(path))
    trials = plan_trials(spec, 4)
    assert all(1e-4 <= t["max_lr"] <= 1e-2 for t in trials)
    assert trial_flags({"eval_tasks": ["cloze", "x.jsonl"], "fp8_keep_bf16": [], "max_lr": 0.001}) == \
        ["--eval_tasks", "cloze", "x.jsonl", "--fp8_keep_bf16=null", "--max_lr=0.001"]
    t = make_trial(spec, "t0", trials[0], tmp_path / "t0", ["--max_steps", "2"])
    assert t.config["eval_tasks"] == trials[0]["eval_tasks"] and t.config["fp8_keep_bf16"] == ["model.layers.0.*"]
