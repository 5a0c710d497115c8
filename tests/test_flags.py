"""Every command's ``--help`` keeps every flag it had: the flag names each one lists are a committed list.

A flag that disappears (a field renamed, dropped or moved to another dataclass by mistake) fails here
with the command and the flag named. A flag added on purpose: regenerate the list with
``python tests/test_flags.py`` and commit it with the change.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
import sys
from pathlib import Path

import pytest

from yxanul.cli import COMMANDS, main
from yxanul.config import load_yaml, resolve
from yxanul.errors import ConfigError, UserError
from yxanul.flags import merge

FIXTURE = Path(__file__).parent / "fixtures" / "cli_flags.json"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# commands run as a module or a script, besides `yxanul <command>`
MODULES = ["yxanul.tools.bench_table", "yxanul.tools.bench_decide"]
SCRIPTS = ["trainer_fp8.py"]
# an option line of argparse's help: two spaces, then `-x, --name METAVAR` up to the help column
_OPTION_LINE = re.compile(r"^ {2}(-[^ ].*?)(?: {2,}|$)")


def flags_in(help_text: str) -> list[str]:
    """The ``--name`` flags (aliases included) that argparse's help lists, sorted."""
    flags: set[str] = set()
    for line in help_text.splitlines():
        m = _OPTION_LINE.match(line)
        if m:
            flags.update(re.findall(r"(?:^|[ ,])(--[\w-]+)", m.group(1)))
    return sorted(flags)


def _help_of(call, argv: list[str]) -> str:
    out, saved = io.StringIO(), sys.argv
    sys.argv = argv  # accelerate's --help shows the groups of the flags on the command line
    with contextlib.redirect_stdout(out):
        try:
            code = call()
        except SystemExit as e:  # argparse's --help
            code = e.code
        finally:
            sys.argv = saved
    assert not code, out.getvalue()
    return out.getvalue()


def _script(path: Path):
    """A script as a module (its dataclasses need a module in sys.modules for their type hints)."""
    name = f"example_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def help_texts() -> dict[str, str]:
    texts = {}
    for argv in [[name, "--help"] for name in COMMANDS] + [["tokenizer", "train", "--help"]]:
        texts[" ".join(["yxanul", *argv[:-1]])] = _help_of(lambda a=argv: main(a), ["yxanul", *argv])
    for module in MODULES:
        texts[f"python -m {module}"] = _help_of(lambda m=module: importlib.import_module(m).main(["--help"]),
                                                [module, "--help"])
    for script in SCRIPTS:
        texts[f"examples/{script}"] = _help_of(lambda s=script: _script(EXAMPLES / s).main(["--help"]),
                                               [script, "--help"])
    return texts


def test_every_help_keeps_every_flag():
    expected = json.loads(FIXTURE.read_text())
    now = {cmd: flags_in(text) for cmd, text in help_texts().items()}
    assert set(now) >= set(expected), f"commands gone: {sorted(set(expected) - set(now))}"
    lost = {cmd: sorted(set(flags) - set(now[cmd])) for cmd, flags in expected.items()}
    assert not {cmd: gone for cmd, gone in lost.items() if gone}, "flags no longer in --help"
    assert all(len(flags) >= 2 for flags in now.values())  # --help itself and at least one own flag


def test_no_help_shows_a_docstring_written_for_callers():
    """A help text is for the user: no reST of a docstring's parameter notes (find-batch's showed
    "``speed_table``: the speed defaults (None: the shipped table)")."""
    leaks = {cmd: line for cmd, text in help_texts().items() for line in text.splitlines() if "``" in line}
    assert not leaks, leaks


def test_a_whole_number_is_read_exactly_or_refused():
    """Digits are read exactly however long (a float made 10**23 - 1 into 99999999999999991611392); a float
    spelling is taken only where a float holds the number exactly."""
    from yxanul.flags import whole_number

    assert whole_number("99999999999999999999999") == 10**23 - 1 and whole_number("-12") == -12
    assert whole_number("2e8") == 200_000_000 and whole_number("1_000") == 1000 and whole_number("3.0") == 3
    assert whole_number("1e30") is None and whole_number("3.5") is None


def test_a_config_that_is_a_folder_says_so(tmp_path):
    with pytest.raises(UserError, match=f"config file '{tmp_path}': a folder, not a YAML file"):
        load_yaml(str(tmp_path))


def test_flags_in_reads_options_and_aliases_only():
    text = ("usage: x [--a A]\n\noptions:\n  -h, --help  show\n  --max_lr MAX_LR, --lr MAX_LR\n"
            "                        peak lr (see --warmup_steps)\n  --fp8_format {hybrid,e4m3}\n")
    assert flags_in(text) == ["--fp8_format", "--help", "--lr", "--max_lr"]


if __name__ == "__main__":  # regenerate the committed list after adding a flag on purpose
    FIXTURE.write_text(json.dumps({cmd: flags_in(t) for cmd, t in help_texts().items()}, indent=1) + "\n")
    print(f"wrote {FIXTURE}")


def test_merge_strict_refuses_an_unknown_yaml_key_in_one_line():
    types_ = {"max_lr": float, "max_steps": int}
    with pytest.raises(ConfigError, match="max_lrr.*did you mean 'max_lr'") as e:
        merge(types_, {"max_lrr": 1e-3}, {}, mode="strict")
    assert "\n" not in str(e.value)


def test_merge_subset_ignores_other_sections_keys_and_flags_win():
    types_ = {"dataset": str | None, "datasets": list[dict] | None, "seq_length": int}
    yaml_values = {"max_lr": 1e-3, "datasets": [{"name": "a"}], "seq_length": "256"}
    others = {"max_lr", "max_steps"}  # the larger config's other keys
    assert merge(types_, yaml_values, {"seq_length": "128"}, mode="subset", others=others) == {
        "datasets": [{"name": "a"}], "seq_length": 128}
    # a flag replaces the file's value of its twin in the other unit; unset (None) it replaces nothing
    assert merge(types_, yaml_values, {"dataset": "x"}, mode="subset", replaces={"dataset": "datasets"},
                 others=others) == {"dataset": "x", "seq_length": 256}
    assert "datasets" in merge(types_, yaml_values, {"dataset": None}, mode="subset",
                               replaces={"dataset": "datasets"}, others=others)
    with pytest.raises(ConfigError, match="seq_length"):
        merge(types_, {"seq_length": "long"}, {}, mode="subset", others=others)
    # a key of neither (a typo) is the strict mode's one line, with the closest key of either
    with pytest.raises(ConfigError, match="datsets.*did you mean 'datasets'"):
        merge(types_, {"datsets": [{"name": "a"}]}, {}, mode="subset", others=others)
    with pytest.raises(ConfigError, match="max_stepz.*did you mean 'max_steps'"):
        merge(types_, {"max_stepz": 3}, {}, mode="subset", others=others)


def test_train_and_plot_lr_share_the_merge(tmp_path):
    """A train config whose keys plot-lr does not use, and a flag in the other warmup unit than the file's."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_steps: 200\nwarmup_steps: 20\ntarget_tokens_per_step: 1000\nuse_wandb: false\n")
    with pytest.raises(ConfigError, match="max_stepz"):
        resolve({"max_stepz": 1})
    c = resolve(load_yaml(str(cfg)), {"warmup_tokens": 5000})
    assert (c.optim.warmup_steps, c.train.max_steps) == (5, 200)


def test_command_fields_reuse_the_section_field_help_default_and_check():
    from yxanul.evaluation.run import EvalCommand
    from yxanul.models.args import ModelArgs
    from yxanul.tools.bench import BenchCommand
    from yxanul.tools.plot_lr import PlotLRCommand
    from yxanul.training.optim import OptimArgs

    bench, plot = BenchCommand.__dataclass_fields__, PlotLRCommand.__dataclass_fields__
    for name in ("loss_impl", "cuda_graphs", "backend"):
        assert bench[name].metadata["help"] == ModelArgs.__dataclass_fields__[name].metadata["help"]
        assert bench[name].default == ModelArgs.__dataclass_fields__[name].default
    assert plot["max_lr"].metadata["help"].startswith(OptimArgs.__dataclass_fields__["max_lr"].metadata["help"])
    assert plot["max_lr"].default is None  # unset: the config's value
    # the section's own cross-check, the same one line as `yxanul train`'s
    with pytest.raises(ConfigError, match="cuda_graphs.*gradient_checkpointing"):
        BenchCommand(cuda_graphs=True, gradient_checkpointing=True)
    with pytest.raises(ConfigError, match="^config key 'rope_kernel': expected te without fuse_qkv_rope"):
        BenchCommand(rope_kernel="triton")
    assert BenchCommand(rope_kernel="triton", fuse_qkv_rope=True).rope_kernel == "triton"
    with pytest.raises(ConfigError, match="eval_steps"):
        EvalCommand(model="x", eval_steps=0)


def test_same_as_refuses_another_type():
    import dataclasses

    from yxanul.flags import fields_of, same_as
    from yxanul.training.optim import OptimArgs

    @dataclasses.dataclass
    class Wrong:
        max_lr: int = same_as(OptimArgs, "max_lr")

    with pytest.raises(TypeError, match="Wrong.max_lr"):
        fields_of(Wrong)


def test_config_fields_are_typed_with_their_section():
    import typing

    from yxanul.config import Config, _sections

    sections = dict(_sections())
    hints = typing.get_type_hints(Config, localns={cls.__name__: cls for cls in sections.values()})
    for name, cls in sections.items():
        assert hints[name] in (cls, cls | None), (name, hints[name])


def test_find_batch_takes_its_own_flags_and_hands_the_rest_to_train():
    from yxanul.tools.find_batch import _parse

    own, cfg = _parse(["--no_cache", "--max_steps", "50", "--world_size", "2", "--seq_length", "64"])
    assert (own.no_cache, own.world_size, cfg.train.max_steps, cfg.model.seq_length) == (True, 2, 50, 64)
    with pytest.raises(ConfigError, match="world_size"):
        _parse(["--world_size", "0"])


def test_a_positional_given_as_a_flag_says_it_is_positional(capsys):
    """`yxanul export RUN --out DIR`: argparse takes DIR as OUT and leaves '--out' over; the line names OUT as
    positional with the usage, never "did you mean '--out'" (the flag just refused)."""
    assert main(["export", "some-run", "--out", "some-dir"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: yxanul export: unknown flag '--out' (OUT is positional: yxanul export MODEL OUT)", err
    assert main(["export", "some-run", "some-dir", "--formt", "llama"]) == 2
    assert "unknown flag '--formt' (did you mean '--format'?)" in capsys.readouterr().err


def test_every_flag_the_docs_show_exists():
    """Each `yxanul <command> ... --flag` written in README.md, docs/ and scripts/device/README.md names a flag
    that command has (the committed list; find-batch and sweep hand train's flags on; launch takes
    accelerate's): a renamed flag cannot leave a doc whose command fails when copied."""
    known = {cmd: {f.lstrip("-") for f in names} for cmd, names in json.loads(FIXTURE.read_text()).items()}
    handed_on = {"yxanul find-batch": known["yxanul train"], "yxanul sweep": known["yxanul train"]}
    commands = sorted((c for c in known if c.startswith("yxanul ")), key=len, reverse=True)
    root = FIXTURE.parents[2]
    docs = [root / "README.md", root / "scripts" / "device" / "README.md", *sorted((root / "docs").glob("*.md"))]
    wrong = []
    for doc in docs:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            for m in re.finditer(r"yxanul [a-z-]+(?: train)?[^`\n|]*", line):
                cmd = next((c for c in commands if m.group(0) == c or m.group(0).startswith(c + " ")), None)
                if cmd is None or cmd == "yxanul launch":
                    continue
                allowed = known[cmd] | handed_on.get(cmd, set()) | {"flag"}  # `[--flag value ...]` in a usage line
                wrong += [f"{doc.relative_to(root)}:{n}: {cmd} --{f}" for f in re.findall(r"(?<![\w-])--([\w-]+)",
                                                                                        m.group(0)) if f not in allowed]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("argv, key", [
    (["train", "--output_dir", ""], "output_dir"), (["train", "--resume="], "resume"),
    (["train", "--data_dir", ""], "data_dir"), (["train", "--config", ""], "config"),
    (["prepare", "--tokenizer="], "tokenizer"),
    (["eval", "run", "--data_dir="], "data_dir")])
def test_a_path_flag_given_empty_is_one_line_not_the_default(capsys, argv, key):
    """`--output_dir "$DIR"` with DIR unset: the flag's default would silently be used (runs/<name>, a fresh start
    instead of the resume, the default cache, the embedded default run)."""
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: config key '{key}': expected a non-empty value (leave the flag out for its default), got ''"]


def test_a_literals_own_none_is_a_value_not_unset():
    """`--master_weights none` where the field is Optional (the command's "unset: the config's value") chose none;
    it was read as unset, so the config's (or a speed default's) fp32 won."""
    import dataclasses
    from typing import Literal

    from yxanul.flags import coerce, parse_command, same_as
    from yxanul.precision.args import PrecisionArgs

    Command = dataclasses.make_dataclass("Command", [("master_weights", Literal["none", "fp32"] | None,
                                                      same_as(PrecisionArgs, "master_weights", default=None))])
    assert parse_command(Command, ["--master_weights", "none"], prog="x").master_weights == "none"
    assert parse_command(Command, ["--master_weights", "null"], prog="x").master_weights is None
    assert parse_command(Command, [], prog="x").master_weights is None
    assert coerce("loss_impl", Literal["default", "te"] | None, "none", from_cli=True) is None  # no own none
