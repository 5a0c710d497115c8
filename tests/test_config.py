"""Config: YAML + CLI merge, strictness and one-line errors (real parser, real subprocess)."""

import re
import subprocess
import sys

import pytest
import yaml

from yxanul.config import parse_args, resolve
from yxanul.errors import ConfigError, UserError


def test_defaults_yaml_then_cli(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("max_lr: 0.001\nmodel: nano\nseq_length: 64\nuse_fp8: true\n")
    cfg = parse_args(["--config", str(p), "--seq_length", "32", "--max_steps", "700"])
    assert cfg.optim.max_lr == 0.001          # from YAML
    assert cfg.model.seq_length == 32         # CLI wins over YAML
    assert cfg.train.max_steps == 700
    assert cfg.precision.use_fp8 is True
    assert cfg.optim.warmup_steps == 100      # dataclass default
    flat = cfg.to_flat_dict()
    assert flat["seq_length"] == 32 and flat["max_lr"] == 0.001


def test_bool_flag_forms():
    assert parse_args(["--use_fp8"]).precision.use_fp8 is True
    assert parse_args(["--use_fp8", "false"]).precision.use_fp8 is False
    assert parse_args(["--use_tensorboard", "no"]).tracking.use_tensorboard is False
    assert parse_args(["--use_fp8", "False"]).precision.use_fp8 is False  # any case, as YAML 1.1 and Python print
    assert parse_args(["--use_fp8", "TRUE"]).precision.use_fp8 is True
    assert resolve({"use_tensorboard": "No"}).tracking.use_tensorboard is False
    with pytest.raises(ConfigError, match="^config key 'use_wandb': expected true or false, got 'maybe'"):
        parse_args(["--use_wandb", "maybe"])  # not "unexpected argument 'maybe'"
    assert resolve({"use_tensorboard": 0}).tracking.use_tensorboard is False  # YAML's 0 as the flag's 0
    assert resolve({"use_fp8": 1}).precision.use_fp8 is True
    with pytest.raises(ConfigError, match="use_fp8"):
        resolve({"use_fp8": 2})


def test_a_double_dash_before_the_flags_is_a_separator_not_a_flag():
    """`yxanul train -- --max_steps 7` (as after `accelerate launch train.py`) trains 7 steps: no config key ''."""
    assert parse_args(["--", "--max_steps", "7"]).train.max_steps == 7


def test_unknown_yaml_key_suggests():
    with pytest.raises(ConfigError, match=r"max_lrr.*did you mean 'max_lr'"):
        resolve({"max_lrr": 1.0})


@pytest.mark.parametrize("key,value", [("max_steps", "ten"), ("max_lr", [1]), ("fp8_format", "e3m4"),
                                       ("max_steps", 2.5), ("use_fp8", "maybe"), ("max_lr", -1.0),
                                       ("keep_last", 0), ("eval_tasks_limit", 0),
                                       # run_name names folders in the run (tensorboard/<run_name>): never outside
                                       ("run_name", "../../elsewhere"), ("run_name", "/abs"), ("run_name", " ")])
def test_bad_values_name_the_key(key, value):
    with pytest.raises(ConfigError) as e:
        resolve({key: value})
    assert key in str(e.value)


def test_yaml_only_field_rejected_on_cli():
    with pytest.raises(UserError, match="curriculum"):
        resolve(cli_values={"curriculum": "[1,2]"})


def test_missing_and_invalid_config_file(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        parse_args(["--config", str(tmp_path / "nope.yaml")])
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1,\n")
    with pytest.raises(UserError, match="not valid YAML"):
        parse_args(["--config", str(bad)])


@pytest.mark.parametrize("args,needle", [
    (["--max_stepz", "3"], "config key 'max_stepz': expected a known config key (did you mean 'max_steps'?)"),
    (["--max_steps", "3", "oops"], "unexpected argument 'oops'"),
    (["--max_steps", "abc"], "max_steps"),
    (["--fp8_format", "nope"], "fp8_format"),
    (["--use_fp8", "--fuse_qkv_params", "--fp8_weight_all_gather"],  # valid config, no FSDP2 launch
     "config key 'fp8_weight_all_gather': expected false outside an FSDP2 launch"),
])
def test_cli_errors_are_one_line_exit_2(args, needle):
    r = subprocess.run([sys.executable, "-m", "yxanul", "train", *args], capture_output=True, text=True)
    assert r.returncode == 2
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    assert needle in lines[0] and "Traceback" not in r.stderr


def test_help_lists_seed_flags():
    r = subprocess.run([sys.executable, "-m", "yxanul", "train", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    for flag in ["--max_steps", "--run_name", "--output_dir", "--resume", "--list_checkpoints",
                 "--checkpoint_freq", "--eval_freq", "--use_tensorboard", "--use_wandb", "--seed",
                 "--model", "--seq_length", "--micro_batch_size", "--gradient_accumulation_steps",
                 "--max_lr", "--min_lr_ratio", "--warmup_steps", "--weight_decay", "--max_grad_norm",
                 "--use_fp8", "--fp8_format", "--fp8_margin", "--fp8_interval"]:
        assert flag in r.stdout, flag


def test_shipped_configs_are_valid():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    files = sorted((root / "examples" / "configs").glob("*.yaml")) + [root / "yxanul" / "assets" / "default.yaml"]
    assert len(files) >= 4
    for f in files:
        cfg = parse_args(["--config", str(f)])
        flat, raw = cfg.to_flat_dict(), yaml.safe_load(f.read_text())
        assert raw and cfg.source == str(f)
        for key, value in raw.items():  # every key of the file reached the config, with its value
            got = flat[key]
            if isinstance(got, float):
                assert got == pytest.approx(float(value)), (f, key)
            else:
                assert got == value, (f, key, got, value)


def test_parsing_and_help_do_not_import_torch():
    """`yxanul train --help` and one-line config errors answer at once: every component's *Args
    module (and the lazy package inits) stay free of torch/transformers."""
    code = ("import sys\n"
            "from yxanul.config import parse_args, build_parser\n"
            "build_parser().format_help()\n"
            "cfg = parse_args(['--config', 'yxanul/assets/default.yaml', '--model', 'medium', '--use_fp8'])\n"
            "heavy = sorted(m for m in ('torch', 'transformers', 'accelerate', 'datasets', 'numpy') "
            "if m in sys.modules)\n"
            "print(cfg.model.model, heavy)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "medium []", r.stdout + r.stderr


def test_lazy_package_exports_resolve():
    """Every package that exports lazily (yxanul/_lazy.py), found by walking the tree: each name in
    its __all__ imports from the module it is mapped to and is the object of that name."""
    import importlib
    import pkgutil
    import types

    import yxanul

    lazy = []
    for info in pkgutil.walk_packages(yxanul.__path__, "yxanul."):
        if info.ispkg:
            pkg = importlib.import_module(info.name)
            if getattr(getattr(pkg, "__getattr__", None), "__module__", None) == "yxanul._lazy":
                lazy.append(pkg)
    names = {pkg.__name__ for pkg in lazy}
    assert {"yxanul.checkpoint", "yxanul.data", "yxanul.integrations", "yxanul.models", "yxanul.precision",
            "yxanul.training", "yxanul.training.batching"} <= names, names
    for pkg in lazy:
        assert pkg.__all__ and sorted(dir(pkg)) == sorted(pkg.__all__), pkg.__name__
        for name in pkg.__all__:
            obj = pkg.__getattr__(name)  # the lazy mapping itself
            assert getattr(obj, "__name__", name) == name, f"{pkg.__name__}.{name} -> {obj!r}"
            # once imported, a submodule of the same name (yxanul.data.prepare) is what attribute access finds
            if not isinstance(getattr(pkg, name), types.ModuleType):
                assert getattr(pkg, name) is obj, f"{pkg.__name__}.{name}"
        with pytest.raises(AttributeError):
            pkg.no_such_name  # noqa: B018


# --------------------------------------------------------------------------- warmup in tokens
def test_warmup_tokens_round_up_to_whole_steps():
    from yxanul.training.schedule import warmup_steps_for_tokens

    assert warmup_steps_for_tokens(100_000_000, 131_072) == 763      # 762.94 -> the first step at or past it
    assert warmup_steps_for_tokens(763 * 131_072, 131_072) == 763    # exact: no extra step
    assert warmup_steps_for_tokens(762 * 131_072 + 1, 131_072) == 763
    assert warmup_steps_for_tokens(0, 131_072) == 0
    with pytest.raises(ConfigError, match="warmup_tokens"):
        warmup_steps_for_tokens(-1, 131_072)


def test_warmup_tokens_use_the_runs_tokens_per_step(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    base = {"seq_length": 128, "warmup_tokens": 10_000, "max_steps": 500}
    assert resolve({**base, "target_tokens_per_step": 4096}).optim.warmup_steps == 3         # 2.44 -> 3
    assert resolve({**base, "target_effective_batch_size": 16}).optim.warmup_steps == 5      # 16 x 128: 4.88
    assert resolve({**base, "micro_batch_size": 4, "gradient_accumulation_steps": 2}).optim.warmup_steps == 10
    monkeypatch.setenv("WORLD_SIZE", "4")  # without a target: micro x accumulation x world x seq_length
    assert resolve({**base, "micro_batch_size": 4, "gradient_accumulation_steps": 2}).optim.warmup_steps == 3
    with pytest.raises(ConfigError, match="config key 'warmup_tokens'.*target_tokens_per_step"):
        resolve({**base, "auto_batch_size": True})  # the micro-batch is only known at run time


def test_warmup_tokens_saved_config_loads_again_with_the_same_steps(tmp_path):
    from yxanul.config import load_yaml

    cfg = resolve({"seq_length": 128, "target_tokens_per_step": 4096, "warmup_tokens": 10_000})
    cfg.save(tmp_path / "config.yaml")
    saved = load_yaml(str(tmp_path / "config.yaml"))
    assert (saved["warmup_tokens"], saved["warmup_steps"]) == (10_000, 3)  # what a resume reads back
    assert resolve(saved).optim.warmup_steps == 3


def test_warmup_flag_replaces_the_files_other_unit(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("seq_length: 128\ntarget_tokens_per_step: 4096\nwarmup_steps: 50\n")
    assert parse_args(["--config", str(f), "--warmup_tokens", "8192"]).optim.warmup_steps == 2
    f.write_text("seq_length: 128\ntarget_tokens_per_step: 4096\nwarmup_tokens: 8192\n")
    cfg = parse_args(["--config", str(f), "--warmup_steps", "7"])
    assert (cfg.optim.warmup_steps, cfg.optim.warmup_tokens) == (7, None)


def test_every_foreign_spelling_points_at_a_real_key_with_its_meaning():
    """Each other trainer's name maps to a key `yxanul train` has (or `yxanul plan`'s gpus/nodes, or to advice),
    is not itself a yxanul key, and the common ones mean what they say."""
    from yxanul.config import _fields
    from yxanul.foreign_keys import FOREIGN_KEYS

    ours = set(_fields())
    for foreign, (key, what) in FOREIGN_KEYS.items():
        assert foreign not in ours and what, foreign
        assert key is None or key in ours or key in ("gpus", "nodes"), (foreign, key)
    meaning = {"block_size": "seq_length", "seq_len": "seq_length", "context_length": "seq_length",
               "max_iters": "max_steps", "total_steps": "max_steps", "lr": "max_lr", "learning_rate": "max_lr",
               "grad_accum": "gradient_accumulation_steps", "accumulate_grad_batches": "gradient_accumulation_steps",
               "grad_clip": "max_grad_norm", "gradient_clipping": "max_grad_norm", "warmup_iters": "warmup_steps",
               "save_steps": "checkpoint_freq", "eval_interval": "eval_freq", "log_interval": "log_freq",
               "batch_size": "micro_batch_size", "global_batch_size": "target_tokens_per_step",
               "resume_from_checkpoint": "resume", "out_dir": "output_dir", "adam_beta2": "beta2",
               "num_epochs": "max_steps", "prefetch_factor": "num_workers"}
    assert {k: FOREIGN_KEYS[k][0] for k in meaning} == meaning


def test_another_trainers_value_for_a_key_names_what_to_set_instead():
    """`--mixed_precision fp8` (accelerate's spelling) points at use_fp8, fp16 says why there is none; every such
    value is one the key refuses."""
    from yxanul.config import _fields
    from yxanul.foreign_keys import FOREIGN_VALUES

    with pytest.raises(ConfigError, match=r"'mixed_precision': expected one of 'auto', 'fp32', 'bf16' \(FP8 is its "
                                          r"own key, use_fp8 true; .*\), got 'fp8'"):
        parse_args(["--mixed_precision", "fp8"])
    with pytest.raises(ConfigError, match=r"\(no fp16: .*\), got 'FP16'"):
        resolve({"mixed_precision": "FP16"})
    for (key, value) in FOREIGN_VALUES:
        with pytest.raises(ConfigError, match=key):
            resolve({key: value})
        assert key in _fields()


def test_warmup_as_long_as_the_run_is_refused():
    """Step s takes lr_at(s - 1): with warmup_steps == max_steps the last step is still warming up."""
    with pytest.raises(ConfigError, match=r"config key 'warmup_steps': expected less than max_steps \(20\)"):
        resolve({"warmup_steps": 20, "max_steps": 20})
    assert resolve({"warmup_steps": 19, "max_steps": 20}).optim.warmup_steps == 19


def test_warmup_tokens_beyond_max_steps_is_refused():
    with pytest.raises(ConfigError, match=r"config key 'warmup_tokens': .*less than max_steps \(100\).* "
                                          r"8,192,000 tokens are 2000 steps"):
        resolve({"seq_length": 128, "target_tokens_per_step": 4096, "warmup_tokens": 8_192_000, "max_steps": 100})
    cfg = resolve({"seq_length": 128, "target_tokens_per_step": 4096, "warmup_tokens": 8_192_000, "max_steps": 100,
                   "lr_decay_steps": 4000})  # a longer schedule than this piece of the run: allowed
    assert cfg.optim.warmup_steps == 2000


def test_warmup_in_both_units_is_one_line_exit_2(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("seq_length: 128\ntarget_tokens_per_step: 4096\nwarmup_steps: 50\nwarmup_tokens: 100000\n")
    r = subprocess.run([sys.executable, "-m", "yxanul", "train", "--config", str(f)], capture_output=True, text=True,
                       timeout=120)  # were the check gone, this would train: fail instead of waiting
    assert r.returncode == 2
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "config key 'warmup_steps'" in lines[0] and "warmup_tokens 100,000 = 25 steps" in lines[0], lines[0]


def test_warmup_tokens_with_a_curriculum_use_the_runs_constant_tokens_per_step(tmp_path, capsys):
    """Stages change seq_length, not tokens per step (schedule.py): the conversion uses the model's
    seq_length (the base plan) whatever the stage, and plot-lr gives the same warmup end."""
    from yxanul.tools.plot_lr import main as plot_lr

    f = tmp_path / "c.yaml"
    f.write_text("seq_length: 128\ntarget_effective_batch_size: 8\nwarmup_tokens: 2500\nmax_steps: 50\n"
                 "curriculum:\n  - {seq_length: 64, until_steps: 10}\n  - {seq_length: 128}\n")
    assert parse_args(["--config", str(f)]).optim.warmup_steps == 3  # 2500 / (8 x 128) = 2.44 -> 3
    assert "warmup 2,500 tokens = 3 steps (1,024 tokens per optimizer step" in capsys.readouterr().out
    plot_lr(["--config", str(f), "--out", str(tmp_path / "lr.png")])
    assert "warmup end: step        4" in capsys.readouterr().out  # trainer numbering: first step at max_lr


def test_a_default_warmup_longer_than_the_users_run_adapts_in_one_line(tmp_path, capsys):
    """`yxanul train --max_steps 20`: the embedded default's warmup (30) shrinks to a tenth of the run and
    says so; the same conflict between two values the user set (flags or their own file) stays an error."""
    from yxanul.config import DEFAULT_CONFIG

    cfg = parse_args(["--config", DEFAULT_CONFIG, "--max_steps", "20"])
    assert (cfg.optim.warmup_steps, cfg.train.max_steps) == (2, 20)
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["warmup_steps: the default 30 is longer than max_steps 20: warming up for 2 step(s) instead "
                   "(a tenth of the run; set --warmup_steps to choose)"]
    assert parse_args(["--config", DEFAULT_CONFIG, "--max_steps", "1"]).optim.warmup_steps == 0  # max_lr at once
    assert parse_args(["--config", DEFAULT_CONFIG, "--max_steps", "40"]).optim.warmup_steps == 30  # no conflict
    assert parse_args(["--config", DEFAULT_CONFIG]).notes == []  # the default run is unchanged
    own = tmp_path / "own.yaml"
    own.write_text("max_steps: 50\n")  # warmup from the dataclass default (100): adapts too
    assert parse_args(["--config", str(own)]).optim.warmup_steps == 5
    for argv in (["--config", DEFAULT_CONFIG, "--max_steps", "20", "--warmup_steps", "30"],
                 ["--config", str(own), "--warmup_steps", "60"]):
        with pytest.raises(ConfigError, match=r"config key 'warmup_steps': expected less than max_steps"):
            parse_args(argv)
    own.write_text("warmup_steps: 30\n")  # the user's file and the user's flag conflict: an error
    with pytest.raises(ConfigError, match=r"less than max_steps \(20\)"):
        parse_args(["--config", str(own), "--max_steps", "20"])


def test_a_preset_in_the_wrong_case_gets_a_suggestion():
    """A case-only difference names that preset even where difflib alone finds none (all capitals) or another
    one ('XLarge' is closer to 'large' by difflib's ratio)."""
    for typed, preset in (("Nano", "nano"), ("NANO", "nano"), ("XLarge", "xlarge")):
        with pytest.raises(ConfigError, match=rf"\(did you mean '{preset}'\?\), got '{typed}'"):
            parse_args(["--model", typed])
    with pytest.raises(ConfigError, match=r"\(did you mean 'gpt2-124m'\?\)"):
        parse_args(["--model", "gpt2-124"])


@pytest.mark.parametrize("args,needle", [
    ([], "'fp8_weight_all_gather': expected false without use_fp8"),
    (["--use_fp8", "--fp8_recipe", "block"], "expected false with fp8_recipe block (TE's FSDP2 hooks"),
    (["--use_fp8"], "'fuse_qkv_params': expected true with fp8_weight_all_gather (TE cannot split"),
    (["--use_fp8", "--fuse_qkv_params", "--backend", "torch"], "expected false with backend torch"),
    (["--use_fp8", "--fuse_qkv_params", "--cuda_graphs"], "expected false with cuda_graphs True"),
    (["--use_fp8", "--fuse_qkv_params", "--mixed_precision", "bf16", "--master_weights", "fp32"],
     "expected false with master_weights fp32 (TE's FusedAdam keeps the fp32 masters here)"),
])
def test_fp8_weight_all_gather_refuses_what_fp8_weights_cannot_train_with(args, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        parse_args(["--fp8_weight_all_gather", *args])
    assert parse_args(["--fp8_weight_all_gather", "--use_fp8", "--fuse_qkv_params"]).precision.fp8_weight_all_gather


def test_dashes_spell_the_same_flag_and_other_trainers_names_point_to_yxanuls(tmp_path):
    """`--micro-batch-size` is `--micro_batch_size` (as transformers' HfArgumentParser takes both); a key another
    trainer names differently (--learning-rate, a YAML's learning_rate, --checkpoint-dir) stays refused, and its
    one line names yxanul's key, not the nearest spelling."""
    from yxanul.flags import parse_command
    from yxanul.planning.cli import PlanCommand

    cfg = parse_args(["--micro-batch-size", "4", "--max-steps=7", "--use-fp8"])
    assert (cfg.batch.micro_batch_size, cfg.train.max_steps, cfg.precision.use_fp8) == (4, 7, True)
    assert parse_command(PlanCommand, ["--seq-length", "1024", "--gpu-memory", "40"], "yxanul plan").gpu_memory == 40
    with pytest.raises(ConfigError, match=r"'learning-rate': .*yxanul's key is 'max_lr': the peak learning rate"):
        parse_args(["--learning-rate", "3e-4"])
    with pytest.raises(ConfigError, match=r"yxanul's key is 'output_dir'"):
        parse_args(["--checkpoint_dir", "ckpts"])
    p = tmp_path / "c.yaml"
    p.write_text("learning_rate: 3.0e-4\n")
    with pytest.raises(ConfigError, match=r"'learning_rate': .*yxanul's key is 'max_lr'"):
        parse_args(["--config", str(p)])
    with pytest.raises(ConfigError, match=r"'devices': .*\(processes and nodes are the launcher's: accelerate launch"):
        parse_args(["--devices", "8"])  # no key: where it is set instead
    with pytest.raises(ConfigError, match=r"did you mean 'max_steps'"):  # a plain typo keeps its nearest key
        parse_args(["--max-stepz", "3"])
    for flags, needle in ((["--precision", "bf16-mixed"], "'mixed_precision': auto, fp32 or bf16"),  # seed spellings
                          (["--bf16"], "'mixed_precision'"), (["--deepspeed", "ds_configs/zero1.json"],
                                                              "accelerate_configs/deepspeed_zero1_fp8.yaml"),
                          (["--max_batch_size", "128"], "'max_micro_batch_size'"),
                          (["--warmup_ratio", "0.1"], "'warmup_steps'")):
        with pytest.raises(ConfigError, match=re.escape(needle)):
            parse_args(flags)
    from yxanul.tools.plot_lr import main as plot_lr

    with pytest.raises(UserError, match=r"'--total_steps' \(yxanul's key is 'max_steps'"):  # commands too
        plot_lr(["--total_steps", "1760"])
    with pytest.raises(UserError, match=r"unknown flag '--devices' \(yxanul's key is 'gpus'\)"):
        parse_command(PlanCommand, ["--devices", "8"], "yxanul plan")  # plan has the key train leaves to the launcher
    with pytest.raises(UserError, match=r"unknown flag '--num-machines' \(yxanul's key is 'nodes'\)"):
        parse_command(PlanCommand, ["--num-machines", "2"], "yxanul plan")
    with pytest.raises(UserError, match=r"unknown flag '--strategy' \(see `yxanul plan --help`\)"):
        parse_command(PlanCommand, ["--strategy", "ddp"], "yxanul plan")  # the launcher advice is train's only


def test_a_penalty_weight_without_a_penalty_type_is_refused():
    """Seed 002 sweeps penalty_weight alone: with penalty_type 'none' every trial would train the same model."""
    with pytest.raises(ConfigError, match=r"'penalty_type': expected z_loss or max_z_loss when penalty_weight is set"):
        parse_args(["--penalty_weight", "0.05"])
    assert resolve({"penalty_weight": 0.05, "penalty_type": "z_loss"}).model.penalty_weight == 0.05
    assert resolve({"penalty_weight": 0, "penalty_type": "none"}).model.penalty_type == "none"


def test_help_shows_the_embedded_default_runs_values_where_it_sets_them():
    """`yxanul train` without --config runs yxanul/assets/default.yaml: its --help says 300 steps, not the 1000
    a --config FILE starts from; `yxanul prepare` likewise (val_fraction)."""
    from yxanul.config import build_parser
    from yxanul.config_file import embedded_defaults
    from yxanul.flags import build_parser as command_parser
    from yxanul.tools.prepare import PrepareCommand

    text = " ".join(build_parser().format_help().split())
    embedded = embedded_defaults()
    assert embedded["max_steps"] == 300
    assert "default: 300 without --config (the embedded default run), 1000 with one" in text
    assert "default: 128 without --config" in text and "default: 'nano')" in text  # same in both: said once
    prepare = " ".join(command_parser(PrepareCommand, "yxanul prepare").format_help().split())
    assert f"default: {embedded['val_fraction']} without --config" in prepare
