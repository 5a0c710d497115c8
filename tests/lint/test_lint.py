"""`yxanul lint-config`: every rule fires on a bad file, shipped configs lint clean, --fix output
lints clean, and the rule tables match what accelerate (and DeepSpeed, when installed) really read."""

from __future__ import annotations

import glob
import json
import os
from unittest import mock

import pytest
import yaml

from yxanul import lint
from yxanul.errors import ConfigError, UserError
from yxanul.lint import accelerate as R_acc
from yxanul.lint import check_launch_environment, fix_config, lint_file, sanitize_deepspeed_config
from yxanul.lint import deepspeed as R_ds

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DS_FILES = sorted(glob.glob(os.path.join(ROOT, "ds_configs", "*.json")))
ACC_FILES = sorted(glob.glob(os.path.join(ROOT, "accelerate_configs", "*.yaml")))
GOOD_DS = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
           "gradient_clipping": "auto", "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 1}}
FSDP2 = {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_reshard_after_forward": True,
         "fsdp_state_dict_type": "SHARDED_STATE_DICT"}
GOOD_ACC = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU",
            "num_processes": 8, "mixed_precision": "fp8", "fp8_config": {"backend": "TE"}}


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data))
    return str(path)


def _keys(problems, severity=None):
    return {p.key for p in problems if severity is None or p.severity == severity}


# (name, config change, key that must be reported, severity)
DS_CASES = [
    ("fp8_block", {"fp8": {"enabled": True}}, "fp8", "warning"),
    ("comm_fp32", {"communication_data_type": "fp32"}, "communication_data_type", "warning"),
    ("grad_accum_fp32", {"data_types": {"grad_accum_dtype": "fp32"}}, "data_types.grad_accum_dtype", "warning"),
    ("fp16_and_bf16", {"fp16": {"enabled": True}}, "fp16.enabled", "error"),
    ("removed_amp", {"amp": {"enabled": True}}, "amp", "error"),
    ("removed_sparse_attention", {"sparse_attention": {}}, "sparse_attention", "error"),
    ("removed_curriculum", {"curriculum_learning": {"enabled": False}}, "curriculum_learning", "error"),
    ("unknown_bf16_key", {"bf16": {"enabled": "auto", "loss_scale": 0}}, "bf16.loss_scale", "error"),
    ("unknown_zero_key", {"zero_optimization": {"stage": 1, "stage1_bucket": 5}},
     "zero_optimization.stage1_bucket", "error"),
    ("removed_zero_key", {"zero_optimization": {"stage": 3, "mics_shard_size": 8}},
     "zero_optimization.mics_shard_size", "error"),
    ("unknown_offload_key", {"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu", "pin": 1}}},
     "zero_optimization.offload_optimizer.pin", "error"),
    ("unfillable_auto", {"communication_data_type": "auto"}, "communication_data_type", "error"),
    ("unfillable_auto_zero", {"zero_optimization": {"stage": 1, "allgather_bucket_size": "auto"}},
     "zero_optimization.allgather_bucket_size", "error"),
    ("optimizer_block", {"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}, "optimizer", "error"),
    ("batch_not_multiple", {"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4,
                            "gradient_accumulation_steps": 2}, "train_batch_size", "error"),
    ("batch_fixed_vs_auto", {"train_batch_size": 64}, "train_batch_size", "warning"),
    ("no_zero", {"zero_optimization": None}, "zero_optimization", "error"),
]


@pytest.mark.parametrize("name,change,key,severity", DS_CASES, ids=[c[0] for c in DS_CASES])
def test_deepspeed_rule_fires_and_fix_is_clean(tmp_path, name, change, key, severity):
    cfg = {**GOOD_DS, **change}
    cfg = {k: v for k, v in cfg.items() if v is not None}
    path = _write(tmp_path, f"{name}.json", cfg)
    problems = lint_file(path)
    assert key in _keys(problems, severity), [p.line() for p in problems]
    out = str(tmp_path / "fixed" / f"{name}.json")
    fix_config(path, out)
    assert lint_file(out) == [], [p.line() for p in lint_file(out)]


def test_batch_size_checked_against_world_size(tmp_path):
    cfg = {**GOOD_DS, "train_batch_size": 64, "train_micro_batch_size_per_gpu": 4,
           "gradient_accumulation_steps": 2}
    path = _write(tmp_path, "ds.json", cfg)
    assert lint_file(path, world_size=8) == []
    assert "train_batch_size" in _keys(lint_file(path, world_size=4), "error")


ACC_CASES = [
    ("dead_fp8_keys", {"fp8_config": {"backend": "TE", "amax_history_length": 16,
                                      "amax_compute_algorithm": "max", "optimization_level": "O1"}},
     "fp8_config.amax_history_length", "warning"),
    ("lower_te", {"fp8_config": {"backend": "te"}}, "fp8_config.backend", "error"),
    ("bad_backend", {"fp8_config": {"backend": "transformer_engine"}}, "fp8_config.backend", "error"),
    ("fp8_no_backend", {"fp8_config": None}, "fp8_config.backend", "warning"),
    ("fp8_ao_backend", {"fp8_config": {"backend": "AO"}}, "fp8_config.backend", "warning"),
    ("fp8_msamp_backend", {"fp8_config": {"backend": "MSAMP"}}, "fp8_config.backend", "warning"),
    ("te_dropped_interval", {"fp8_config": {"backend": "TE", "interval": 1}}, "fp8_config.interval", "warning"),
    ("most_recent", {"fp8_config": {"backend": "TE", "amax_compute_algo": "most_recent"}},
     "fp8_config.amax_compute_algo", "warning"),
    ("unknown_top_key", {"fp8_backend": "te"}, "fp8_backend", "error"),
    ("bad_mixed_precision", {"mixed_precision": "float8", "fp8_config": None}, "mixed_precision", "error"),
    ("fp8_config_unused", {"mixed_precision": "bf16"}, "fp8_config", "warning"),
    ("multi_cpu_one_process", {"distributed_type": "MULTI_CPU", "use_cpu": True, "num_processes": 2,
                               "mixed_precision": "no", "fp8_config": None}, "distributed_type", "error"),
    ("no_distributed_type", {"distributed_type": None}, "distributed_type", "error"),
    ("ds_mixed_precision", {"distributed_type": "DEEPSPEED", "fp8_config": None,
                            "deepspeed_config": {"deepspeed_config_file": "ds_configs/zero1.json"}},
     "mixed_precision", "error"),
    ("ds_conflicting_key", {"distributed_type": "DEEPSPEED", "mixed_precision": None, "fp8_config": None,
                            "deepspeed_config": {"deepspeed_config_file": "ds_configs/zero1.json",
                                                 "gradient_clipping": 1.0}},
     "deepspeed_config.gradient_clipping", "error"),
    ("fsdp1", {"distributed_type": "FSDP", "fsdp_config": {**FSDP2, "fsdp_version": 1}},
     "fsdp_config.fsdp_version", "error"),
    ("fsdp_version_unset", {"distributed_type": "FSDP",
                            "fsdp_config": {"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}},
     "fsdp_config.fsdp_version", "error"),
    ("fsdp_offload", {"distributed_type": "FSDP", "fsdp_config": {**FSDP2, "fsdp_offload_params": True}},
     "fsdp_config.fsdp_offload_params", "warning"),
    ("fsdp_no_reshard", {"distributed_type": "FSDP", "fsdp_config": {**FSDP2, "fsdp_reshard_after_forward": False}},
     "fsdp_config.fsdp_reshard_after_forward", "warning"),
    ("fsdp_no_wrap", {"distributed_type": "FSDP", "fsdp_config": {**FSDP2, "fsdp_auto_wrap_policy": "NO_WRAP"}},
     "fsdp_config.fsdp_auto_wrap_policy", "warning"),
    ("fsdp_full_state_dict", {"distributed_type": "FSDP",
                              "fsdp_config": {**FSDP2, "fsdp_state_dict_type": "FULL_STATE_DICT"}},
     "fsdp_config.fsdp_state_dict_type", "warning"),
    ("fsdp_config_without_fsdp", {"fsdp_config": FSDP2}, "fsdp_config", "warning"),
    ("zero3_init_flag_no_effect", {"distributed_type": "DEEPSPEED", "mixed_precision": None, "fp8_config": None,
                                   "deepspeed_config": {"deepspeed_config_file": "ds_configs/zero3.json",
                                                        "zero3_init_flag": True}},
     "deepspeed_config.zero3_init_flag", "warning"),
]


@pytest.mark.parametrize("name,change,key,severity", ACC_CASES, ids=[c[0] for c in ACC_CASES])
def test_accelerate_rule_fires_and_fix_is_clean(tmp_path, monkeypatch, name, change, key, severity):
    monkeypatch.chdir(ROOT)  # deepspeed_config_file is resolved from the launch directory
    monkeypatch.setenv("ACCELERATE_USE_CPU", "1")  # the CPU fix (MULTI_GPU + use_cpu) is launched with it
    cfg = {k: v for k, v in {**GOOD_ACC, **change}.items() if v is not None}
    path = _write(tmp_path, f"{name}.yaml", cfg)
    problems = lint_file(path)
    assert key in _keys(problems, severity), [p.line() for p in problems]
    out = str(tmp_path / "fixed" / f"{name}.yaml")
    fix_config(path, out)
    left = lint_file(out)
    if name in ("no_distributed_type", "bad_mixed_precision"):
        assert _keys(left) == {key}  # cannot be guessed: reported again, nothing else
    else:
        assert left == [], [p.line() for p in left]


@pytest.mark.parametrize("reshard", [True, "FULL_SHARD", "full_shard"])
def test_fsdp_resharding_after_forward_is_clean_in_either_spelling(tmp_path, monkeypatch, reshard):
    """accelerate's FSDP2 takes `fsdp_reshard_after_forward` as a bool or FSDP1's strategy name: FULL_SHARD is
    the same as true (SHARD_GRAD_OP, like false, keeps the gathered weights: flagged above)."""
    monkeypatch.chdir(ROOT)
    cfg = {**GOOD_ACC, "distributed_type": "FSDP", "fsdp_config": {**FSDP2, "fsdp_reshard_after_forward": reshard}}
    assert "fsdp_config.fsdp_reshard_after_forward" not in _keys(lint_file(_write(tmp_path, "a.yaml", cfg)))
    cfg["fsdp_config"]["fsdp_reshard_after_forward"] = "SHARD_GRAD_OP"
    assert "fsdp_config.fsdp_reshard_after_forward" in _keys(lint_file(_write(tmp_path, "b.yaml", cfg)), "warning")


def test_dead_fp8_keys_renamed_by_fix(tmp_path):
    cfg = {**GOOD_ACC, "fp8_config": {"backend": "te", "amax_history_length": 16, "optimization_level": "O1"}}
    out = str(tmp_path / "o.yaml")
    fix_config(_write(tmp_path, "a.yaml", cfg), out)
    assert yaml.safe_load(open(out))["fp8_config"] == {"backend": "TE", "amax_history_len": 16, "opt_level": "O1"}


def test_precision_agreement_with_yxanul_config(tmp_path):
    path = _write(tmp_path, "a.yaml", {**GOOD_ACC, "mixed_precision": "bf16", "fp8_config": None})
    assert "mixed_precision" in _keys(lint_file(path, use_fp8=True), "warning")
    assert lint_file(path, use_fp8=False) == []
    fp8 = _write(tmp_path, "b.yaml", GOOD_ACC)
    assert "mixed_precision" in _keys(lint_file(fp8, use_fp8=False), "warning")


@pytest.mark.parametrize("path", DS_FILES + ACC_FILES, ids=os.path.basename)
def test_shipped_configs_lint_clean(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "1")  # as every launch with cpu.yaml must (next test)
    assert lint_file(path) == [], [p.line() for p in lint_file(path)]


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "examples", "configs", "*.yaml"))),
                         ids=os.path.basename)
def test_a_training_config_given_as_a_launch_config_says_so(path):
    """examples/configs/test_fp8.yaml has gradient_accumulation_steps, which DeepSpeed configs have too: it must not
    be linted as a DeepSpeed config missing zero_optimization."""
    [p] = lint_file(path)
    assert (p.key, p.severity) == ("<file>", "error") and "a yxanul training config" in p.message, p.line()
    assert f"--train_config {path}" in p.fix


def test_cpu_profile_without_accelerate_use_cpu_warns(monkeypatch):
    """cpu.yaml's use_cpu never reaches torchrun's workers (accelerate 1.15): linted in a shell without
    ACCELERATE_USE_CPU=1, the profile says that the launch would be separate 1-process jobs."""
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    cpu_yaml = os.path.join(ROOT, "accelerate_configs", "cpu.yaml")
    assert [(p.key, p.severity) for p in lint_file(cpu_yaml)] == [("use_cpu", "warning")]
    monkeypatch.setenv("ACCELERATE_USE_CPU", "1")
    assert lint_file(cpu_yaml) == []


def test_seed_broken_config_and_cli(tmp_path, capsys):
    """Seed 003's broken LLaMA-Factory DeepSpeed config: fp8 block + fp32 comm + fp32 accumulation."""
    bad = _write(tmp_path, "ds_z1_fp8.json", {**GOOD_DS, "fp8": {"enabled": True},
                 "communication_data_type": "fp32", "data_types": {"grad_accum_dtype": "fp32"},
                 "fp16": {"enabled": True}})
    assert lint.main([bad]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    problem_lines = [line for line in out if ": warning: " in line or ": error: " in line]
    assert len(problem_lines) == 4 and all(" -> fix: " in line for line in problem_lines)
    assert lint.main([bad, "--fix", "--out", str(tmp_path / "fixed")]) == 1
    fixed = str(tmp_path / "fixed" / "ds_z1_fp8.json")
    assert lint.main([fixed]) == 0
    assert json.load(open(fixed)) == {**GOOD_DS}
    warn_only = _write(tmp_path, "w.json", {**GOOD_DS, "fp8": {}})
    assert lint.main([warn_only]) == 0  # warnings alone exit 0
    capsys.readouterr()
    assert lint.main([warn_only, "--strict"]) == 2  # a CI gate: the ignored fp8 block fails it
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "1 file(s): 0 error(s), 1 warning(s) (--strict: warnings fail)"
    assert lint.main([fixed, "--strict"]) == 0 and lint.main([bad, "--strict"]) == 1  # errors keep exit 1
    # what is no config file is a usage error (exit 2 through the CLI), not a lint finding (exit 1)
    for path, why in ((tmp_path / "missing.json", "no such file"), (tmp_path, "a folder, not a config file")):
        with pytest.raises(UserError, match=f"lint-config: '{path}': {why}"):
            lint.main([fixed, str(path)])
    with pytest.raises(ConfigError, match="config key 'world_size': expected an integer >= 1, got 0"):
        lint.main([fixed, "--world_size", "0"])  # 0 would skip the batch-size check and say ok
    with pytest.raises(UserError, match="FILE"):  # one line, exit code 2 through the CLI
        lint.main([])


def test_cli_dispatch_and_train_config(tmp_path, capsys, monkeypatch):
    from yxanul.cli import main as cli_main

    monkeypatch.chdir(ROOT)
    assert cli_main(["lint-config", *DS_FILES, *ACC_FILES]) == 0
    train = _write(tmp_path, "t.yaml", {"model": "nano", "use_fp8": True})
    assert cli_main(["lint-config", "accelerate_configs/single_gpu_bf16.yaml", "--train-config", train]) == 0
    assert "use_fp8: true" in capsys.readouterr().out
    assert cli_main(["lint-config", "accelerate_configs/single_gpu_bf16.yaml", "--train_config", train, "--fix",
                     "--out", str(tmp_path / "fixed")]) == 0  # a bare --fix does not swallow the next flag
    assert (tmp_path / "fixed" / "single_gpu_bf16.yaml").is_file()
    assert cli_main(["lint-config"]) == 2 and capsys.readouterr().err.count("\n") == 1
    assert cli_main(["lint-config", "x.json", "--fx"]) == 2
    assert "unknown flag '--fx' (did you mean '--fix'?)" in capsys.readouterr().err
    broken = tmp_path / "broken.yaml"
    broken.write_text("max_steps: [\n")
    for bad, needle in [(tmp_path / "none.yaml", "no such file"), (broken, "line 2 is not valid YAML (")]:
        assert cli_main(["lint-config", "accelerate_configs/single_gpu_bf16.yaml", "--train_config", str(bad)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: train_config: config file '{bad}': {needle}"), err
    ds_list = _write(tmp_path, "dsl.yaml", {"distributed_type": "DEEPSPEED", "num_processes": 2,
                                            "deepspeed_config": [1]})
    assert cli_main(["lint-config", ds_list, "--fix", "--out", str(tmp_path / "fx")]) == 1
    out = capsys.readouterr().out
    assert "deepspeed_config: expected a mapping of accelerate's DeepSpeed options, got [1]" in out
    assert "deepspeed_config" not in yaml.safe_load((tmp_path / "fx" / "dsl.yaml").read_text())


@pytest.mark.parametrize("name, text, said", [("bad.json", "{bad", "does not parse (Expecting property name"),
                                              ("empty.json", "", "empty;"), ("comments.yaml", "# none\n", "empty;"),
                                              ("list.json", "[1, 2]", "got a list"),
                                              ("broken.yaml", "a: [\n", "does not parse (")])
def test_a_file_that_is_no_config_mapping_is_a_usage_error(tmp_path, capsys, name, text, said):
    """Exit 1 means "the config parsed and has errors"; a file with no config to lint is the user's mistake: one
    line naming it, exit 2, and nothing linted (also not the good file before it)."""
    from yxanul.cli import main as cli_main

    path = tmp_path / name
    path.write_text(text)
    good = _write(tmp_path, "good.json", GOOD_DS)
    assert cli_main(["lint-config", good, str(path), "--fix"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    assert captured.err.startswith(f"error: lint-config: '{path}': ") and said in captured.err, captured.err
    assert "expected a DeepSpeed JSON object or an accelerate YAML mapping" in captured.err


def test_train_config_settings_the_launch_cannot_run_are_errors(tmp_path, capsys, monkeypatch):
    """The rule the start-up check raises (lint/fsdp.py train_conflicts), reported before a job is queued:
    under FSDP2 CUDA graphs and fp32 master weights, outside it the FP8 weight all-gather."""
    monkeypatch.chdir(ROOT)
    under = _write(tmp_path, "g.yaml", {"model": "medium", "use_fp8": True, "cuda_graphs": True,
                                        "master_weights": "fp32"})
    assert lint.main(["accelerate_configs/fsdp2.yaml", "--train_config", under]) == 1
    out = capsys.readouterr().out
    assert f"{under}: error: cuda_graphs: expected false under FSDP2" in out
    assert f"{under}: error: master_weights: expected none under FSDP2" in out and "(with fsdp2.yaml)" in out
    assert lint.main(["accelerate_configs/single_gpu_fp8.yaml", "--train_config", under]) == 0  # one GPU: fine
    gather = _write(tmp_path, "a.yaml", {"model": "medium", "use_fp8": True, "fp8_weight_all_gather": True,
                                         "fuse_qkv_params": True})
    assert lint.main(["accelerate_configs/fsdp2.yaml", "--train_config", gather]) == 0
    assert lint.main(["accelerate_configs/single_gpu_fp8.yaml", "--train_config", gather]) == 1
    assert "fp8_weight_all_gather: expected false outside an FSDP2 launch" in capsys.readouterr().out
    rope = _write(tmp_path, "r.yaml", {"model": "medium", "fuse_qkv_rope": True})
    assert lint.main(["accelerate_configs/single_gpu_fp8.yaml", "--train_config", rope]) == 0
    assert lint.main(["accelerate_configs/deepspeed_zero1_fp8.yaml", "--train_config", rope]) == 1
    assert f"{rope}: error: fuse_qkv_rope: expected false under DeepSpeed" in capsys.readouterr().out


def test_sanitize_deepspeed_config():
    cfg = {**GOOD_DS, "fp8": {"enabled": True}, "communication_data_type": "fp32",
           "data_types": {"grad_accum_dtype": "fp32"}}
    clean, problems = sanitize_deepspeed_config(cfg, "ds.json")
    assert clean == GOOD_DS and "fp8" in cfg  # input untouched
    assert {p.key for p in problems} == {"fp8", "communication_data_type", "data_types.grad_accum_dtype"}
    assert all(p.severity == "warning" for p in problems)
    assert sanitize_deepspeed_config(GOOD_DS) == (GOOD_DS, [])


def _launch_env(config_file):
    """The environment `accelerate launch --config_file X train.py` gives the training processes,
    computed by accelerate's own launcher code (nothing is started; FP8 availability is faked)."""
    import accelerate.utils.launch as L
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    extra = ["--main_process_ip", "10.0.0.1"] if "hsdp" in config_file else []  # the launchers pass it
    args = launch_command_parser().parse_args(["--config_file", config_file, *extra, "train.py"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    # a port another process holds (a test run beside this one) would make a 2-machine profile raise here
    with mock.patch.object(L, "is_fp8_available", return_value=True), mock.patch.object(L, "is_port_in_use",
                                                                                        return_value=False):
        if args.use_deepspeed:
            fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else [])
            args.deepspeed_fields_from_accelerate_config = ",".join(fields)
            return args, L.prepare_deepspeed_cmd_env(args)[1]
        if args.multi_gpu or args.use_fsdp:  # launch_command: FSDP goes to the torchrun launcher too
            return args, L.prepare_multi_gpu_env(args)
        return args, L.prepare_simple_launcher_cmd_env(args)[1]


@pytest.mark.parametrize("path", ACC_FILES, ids=os.path.basename)
def test_shipped_yaml_through_accelerates_own_loader_and_launcher(path, monkeypatch):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file

    monkeypatch.chdir(ROOT)
    cfg = load_config_from_file(path)
    assert isinstance(cfg, ClusterConfig)
    args, env = _launch_env(path)
    name = os.path.basename(path)
    if "fp8" in name and "deepspeed" not in name:
        assert env["ACCELERATE_MIXED_PRECISION"] == "fp8" and env["ACCELERATE_FP8_BACKEND"] == "TE"
    if name == "cpu.yaml":
        assert args.multi_gpu and args.nproc_per_node == "2"  # torchrun with 2 processes
    if name.startswith("fsdp2"):  # what yxanul's FSDP2 plugin reads (training/fsdp.py)
        assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
        assert env["FSDP_STATE_DICT_TYPE"] == "SHARDED_STATE_DICT" and env["FSDP_RESHARD_AFTER_FORWARD"] == "true"
    if name == "fsdp2_hsdp.yaml":  # 2 nodes x 8: replicate over the nodes, shard inside one
        assert (env["PARALLELISM_CONFIG_DP_REPLICATE_SIZE"], env["PARALLELISM_CONFIG_DP_SHARD_SIZE"]) == ("2", "8")
    assert [p for p in check_launch_environment(env, cuda_available=True) if p.severity == "error"] == []
    if "deepspeed" in name:
        stage = name.split("zero")[1][0]  # deepspeed_zeroN_fp8.yaml -> ds_configs/zeroN.json
        assert env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == f"ds_configs/zero{stage}.json"
        assert "mixed_precision" not in env["ACCELERATE_CONFIG_DS_FIELDS"]


def test_check_launch_environment_rules(tmp_path):
    ds = _write(tmp_path, "ds.json", {**GOOD_DS, "fp8": {}, "amp": {}})
    env = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": ds,
           "ACCELERATE_CONFIG_DS_FIELDS": "deepspeed_config_file,mixed_precision",
           "ACCELERATE_MIXED_PRECISION": "fp8", "ACCELERATE_FP8_BACKEND": "te",
           "ACCELERATE_FP8_AMAX_HISTORY_LENGTH": "16", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    problems = check_launch_environment(env, use_fp8=False, cuda_available=False)
    assert {"amp", "ACCELERATE_CONFIG_DS_FIELDS"} <= _keys(problems, "error")  # the DeepSpeed file is linted too
    assert "fp8" in _keys(problems, "warning") and "fp8" not in _keys(problems, "error")
    assert {"ACCELERATE_FP8_BACKEND", "ACCELERATE_FP8_AMAX_HISTORY_LENGTH",
            "ACCELERATE_MIXED_PRECISION"} <= _keys(problems, "warning")
    # no 'rank 0 of 1' warning under DeepSpeed: the trainer names gloo and DeepSpeed joins the ranks
    assert "ACCELERATE_USE_CPU" not in _keys(problems)
    # but the variable itself (left exported for cpu.yaml) leaves accelerate with no DeepSpeed plugin: refused
    cpu_too = check_launch_environment({**env, "ACCELERATE_USE_CPU": "1"}, use_fp8=False, cuda_available=False)
    assert "ACCELERATE_USE_CPU" in _keys(cpu_too, "error")
    missing = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": "/nope.json"}
    assert "ACCELERATE_DEEPSPEED_CONFIG_FILE" in _keys(check_launch_environment(missing), "error")
    assert check_launch_environment({}) == []


# ---- the rule tables against the installed packages ------------------------------------------
def test_tables_match_accelerate():
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import launch_command_parser
    from accelerate.utils import DistributedType

    assert R_acc.ACC_KEYS - {"fp16", "dynamo_backend"} == set(ClusterConfig.__dataclass_fields__)
    assert R_acc.DISTRIBUTED_TYPES == {d.value for d in DistributedType}
    dests = {a.dest for a in launch_command_parser()._actions}
    assert R_acc.DS_YAML_KEYS <= dests
    fp8_dests = {d[4:] for d in dests if d.startswith("fp8_")}
    assert fp8_dests <= R_acc.FP8_READ_KEYS, fp8_dests - R_acc.FP8_READ_KEYS
    assert not set(R_acc.FP8_DEAD_KEYS) & fp8_dests


def test_tables_match_deepspeed():
    pytest.importorskip("deepspeed", reason="deepspeed not installed (pip install deepspeed)")
    from deepspeed.runtime import config as dsc
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import (
        DeepSpeedZeroOffloadOptimizerConfig,
        DeepSpeedZeroOffloadParamConfig,
    )

    def names(model):
        return {n for n in model.model_fields} | {f.alias for f in model.model_fields.values() if f.alias}

    assert R_ds.DS_REMOVED_TOP == set(dsc._REMOVED_TOP_LEVEL_CONFIG_KEYS)
    assert R_ds.DS_REMOVED_ZERO == set(dsc._REMOVED_ZERO_CONFIG_KEYS)
    assert R_ds.DS_BF16_KEYS == names(DeepSpeedBF16Config)
    assert R_ds.DS_FP16_KEYS == names(DeepSpeedFP16Config)
    assert R_ds.DS_ZERO_KEYS == names(DeepSpeedZeroConfig)
    assert R_ds.DS_OFFLOAD_OPTIMIZER_KEYS == names(DeepSpeedZeroOffloadOptimizerConfig)
    assert R_ds.DS_OFFLOAD_PARAM_KEYS == names(DeepSpeedZeroOffloadParamConfig)


@pytest.mark.parametrize("path", DS_FILES, ids=os.path.basename)
@pytest.mark.parametrize("precision", ["fp8", "bf16"])
def test_shipped_ds_configs_accepted_by_deepspeed(path, precision, monkeypatch):
    """Fill "auto" exactly as accelerate does (DeepSpeedPlugin from the launch env, then
    set_mixed_precision and the values Accelerator._prepare_deepspeed passes), then parse with
    DeepSpeed's real DeepSpeedConfig (pydantic models, removed-key checks, batch-size assert)."""
    pytest.importorskip("deepspeed", reason="deepspeed not installed (pip install deepspeed)")
    from accelerate.utils import DeepSpeedPlugin
    from deepspeed.runtime.config import DeepSpeedConfig

    for key, value in {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": path,
                       "ACCELERATE_CONFIG_DS_FIELDS": "deepspeed_config_file,zero3_init_flag"}.items():
        monkeypatch.setenv(key, value)
    plugin = DeepSpeedPlugin()
    plugin.set_mixed_precision(precision)
    micro, accum, world = 4, 8, 1
    plugin.deepspeed_config_process(
        must_match=False, train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=accum,
        train_batch_size=micro * accum * world, gradient_clipping=1.0,
        **{"zero_optimization.reduce_bucket_size": 1920 * 1920,  # hidden-size keys, as _prepare_deepspeed fills them
           "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * 1920 * 1920),
           "zero_optimization.stage3_param_persistence_threshold": 10 * 1920})
    cfg = dict(plugin.deepspeed_config, steps_per_print=10**9)
    assert "auto" not in json.dumps(cfg)
    parsed = DeepSpeedConfig(cfg)
    assert parsed.train_batch_size == micro * accum * world and parsed.bfloat16_config.enabled
    assert not parsed.float16_config.enabled and parsed.communication_data_type is None
    assert parsed.zero_optimization_stage == json.load(open(path))["zero_optimization"]["stage"]


@pytest.mark.parametrize("zero,key", [
    ({"zero_quantized_weights": True}, "zero_optimization.zero_quantized_weights"),
    ({"offload_param": {"device": "cpu"}}, "zero_optimization.offload_param.device"),
])
def test_zero3_fp8_rules(tmp_path, zero, key):
    """Only for ZeRO-3 with the yxanul config's use_fp8; the same keys in a bf16 run or at stage 2 pass."""
    z3 = _write(tmp_path, "z3.json", {**GOOD_DS, "zero_optimization": {"stage": 3, **zero}})
    assert key in _keys(lint_file(z3, use_fp8=True), "warning")
    assert key not in _keys(lint_file(z3, use_fp8=False))
    env = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": z3, "WORLD_SIZE": "8"}
    assert key in _keys(check_launch_environment(env, use_fp8=True, cuda_available=True), "warning")
    if "offload_param" not in zero:  # offload_param is a stage-3 key: DeepSpeed rejects it below
        z2 = _write(tmp_path, "z2.json", {**GOOD_DS, "zero_optimization": {"stage": 2, **zero}})
        assert key not in _keys(lint_file(z2, use_fp8=True))


def test_fsdp_launch_environment_and_hsdp_sizes(tmp_path):
    """The FSDP rules on what `accelerate launch` exported (FSDP_*), on CPU too (the trainer shards over
    gloo); HSDP's replicate x shard sizes must multiply to num_processes (accelerate's ParallelismConfig)."""
    env = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "1", "FSDP_OFFLOAD_PARAMS": "true",
           "FSDP_RESHARD_AFTER_FORWARD": "false", "FSDP_AUTO_WRAP_POLICY": "NO_WRAP",
           "FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
           "ACCELERATE_USE_CPU": "1"}
    problems = check_launch_environment(env, use_fp8=True, cuda_available=False)
    assert _keys(problems, "error") == {"FSDP_VERSION"}
    assert _keys(problems, "warning") == {"FSDP_OFFLOAD_PARAMS", "FSDP_RESHARD_AFTER_FORWARD", "FSDP_AUTO_WRAP_POLICY"}
    good = {**env, "FSDP_VERSION": "2", "FSDP_OFFLOAD_PARAMS": "false", "FSDP_RESHARD_AFTER_FORWARD": "true",
            "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP"}
    assert check_launch_environment(good, use_fp8=False, cuda_available=False) == []
    hsdp = yaml.safe_load(open(os.path.join(ROOT, "accelerate_configs", "fsdp2_hsdp.yaml")))
    hsdp["parallelism_config"]["parallelism_config_dp_shard_size"] = 4  # 2 x 4 != 16 processes
    assert "parallelism_config" in _keys(lint_file(_write(tmp_path, "h.yaml", hsdp)), "error")
    # what the launch exported: fsdp2_hsdp.yaml's 2 x 8 mesh launched as 2 processes (accelerate raised per rank)
    mesh = {**good, "WORLD_SIZE": "2", "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "2",
            "PARALLELISM_CONFIG_DP_SHARD_SIZE": "8"}
    assert _keys(check_launch_environment(mesh, use_fp8=False, cuda_available=False), "error") == {
        "PARALLELISM_CONFIG_DP_*_SIZE"}
    nothing_to_shard = {**mesh, "PARALLELISM_CONFIG_DP_SHARD_SIZE": "1"}  # 2 x 1: accelerate raises on every rank
    [p] = check_launch_environment(nothing_to_shard, use_fp8=False, cuda_available=False)
    assert p.severity == "error" and "FSDP has nothing to shard across" in p.message
    fitting = {**mesh, "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "1", "PARALLELISM_CONFIG_DP_SHARD_SIZE": "2"}
    assert check_launch_environment(fitting, use_fp8=False, cuda_available=False) == []
