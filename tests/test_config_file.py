"""Config files (yxanul/config_file.py): a key YAML does not read as a name is one line naming it and the file; a
merge key (``<<: *base``) takes the base's keys, the mapping's own override them; ``--config`` given twice is
one line, for `yxanul train` and the commands that read a config."""

from __future__ import annotations

import subprocess
import sys

import pytest

from yxanul.cli import main
from yxanul.config import parse_args
from yxanul.config_file import load_yaml
from yxanul.errors import UserError


@pytest.mark.parametrize("key, read_as", [("5", "the integer 5"), ("on", "the boolean true"),
                                          ("null", "null"), ("1.5", "the float 1.5")])
def test_a_key_that_is_not_a_name_is_one_line_naming_it_and_the_file(tmp_path, key, read_as):
    path = tmp_path / "run.yaml"
    path.write_text(f"max_steps: 5\n{key}: 3\n")
    want = f"config file '{path}': line 2: key '{key}' is read by YAML as {read_as}, not a name"
    with pytest.raises(UserError, match="^" + want.replace(".", r"\.")):
        load_yaml(str(path))
    r = subprocess.run([sys.executable, "-m", "yxanul", "train", "--config", str(path)], capture_output=True,
                       text=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [f"error: {want} (keys are names such as "
                                                                   "max_steps)"], r.stderr


def test_a_merge_key_takes_the_bases_keys_and_the_mappings_own_override_them(tmp_path):
    path = tmp_path / "mix.yaml"
    path.write_text("max_steps: 7\ndatasets:\n  - &web {path: a.jsonl, weight: 2, text_column: body}\n"
                    "  - <<: *web\n    path: b.jsonl\n  - <<: [*web]\n    path: c.jsonl\n    weight: 1\n")
    cfg = parse_args(["--config", str(path)])
    assert cfg.train.max_steps == 7
    assert cfg.data.datasets == [{"path": "a.jsonl", "weight": 2, "text_column": "body"},
                                 {"path": "b.jsonl", "weight": 2, "text_column": "body"},
                                 {"path": "c.jsonl", "weight": 1, "text_column": "body"}]
    path.write_text("datasets:\n  - &web {path: a.jsonl}\n  - <<: *web\n    path: b.jsonl\n    path: c.jsonl\n")
    with pytest.raises(UserError, match="line 5: key 'path' given twice"):  # its own keys: still once each
        load_yaml(str(path))


@pytest.mark.parametrize("command", [["train"], ["plan"], ["plot-lr"], ["prepare"], ["find-batch"]])
def test_config_given_twice_is_one_line(tmp_path, capsys, command):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("max_steps: 5\n")
    b.write_text("max_steps: 6\n")
    assert main([*command, "--config", str(a), f"--config={b}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: yxanul {command[0]}: --config given twice ('{a}', then '{b}'): give it once (the last "
                   "would silently replace the first)"]
