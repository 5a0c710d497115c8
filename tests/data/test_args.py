"""DataArgs: a setting that would do nothing with the others given is one line, not ignored."""

import subprocess
import sys

import pytest

from yxanul.data.args import DataArgs
from yxanul.errors import ConfigError


def test_a_shuffle_buffer_without_streaming_is_one_line():
    """The buffer shuffles streamed sources only (docs/data.md): without streaming it was ignored in silence."""
    with pytest.raises(ConfigError, match=r"^config key 'shuffle_buffer': expected 0 without streaming .*, got 100$"):
        DataArgs(shuffle_buffer=100)
    assert DataArgs(shuffle_buffer=100, streaming=True).shuffle_buffer == 100


def test_the_prepare_command_refuses_it_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "yxanul", "prepare", "--shuffle_buffer", "100", "--data_dir",
                        str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "'shuffle_buffer'" in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()
