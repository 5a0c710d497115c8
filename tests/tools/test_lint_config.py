"""`yxanul lint-config` as the command runs it: the train config validated as `yxanul train --config` validates it
(tools/lint_config.py); the rules and files themselves: tests/lint/test_lint.py."""

import os

import pytest

from yxanul.cli import main as cli_main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("text, said", [
    ('max_steps: "ten"\n', "config key 'max_steps': expected an integer, got 'ten'"),
    ("max_step: 10\n", "config key 'max_step': expected a known config key"),
    ("max_steps: 10\nwarmup_steps: 20\n", "config key 'warmup_steps'")])
def test_train_config_is_validated_as_train_validates_it(tmp_path, capsys, monkeypatch, text, said):
    """A train config that `yxanul train --config` refuses is refused here too (one line naming the file, exit 2),
    not linted as "ok"; a config train takes lints as before."""
    monkeypatch.chdir(ROOT)
    train = tmp_path / "c.yaml"
    train.write_text(text)
    assert cli_main(["train", "--config", str(train)]) == 2
    assert said in capsys.readouterr().err
    assert cli_main(["lint-config", "ds_configs/zero1.json", "--train_config", str(train)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(f"error: train_config '{train}': {said}"), captured
    assert captured.err.count("\n") == 1
    good = tmp_path / "good.yaml"
    good.write_text("max_steps: 10\nwarmup_steps: 2\n")
    assert cli_main(["lint-config", "ds_configs/zero1.json", "--train_config", str(good)]) == 0
    assert "ds_configs/zero1.json: ok" in capsys.readouterr().out
