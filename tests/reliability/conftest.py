"""Fault-injection suite fixtures: one small base run shared per session, copied per test."""

import shutil

import pytest
from _reliability import ok, yx_here
from tiny_run import FAST


@pytest.fixture(scope="session")
def base_run(tmp_path_factory):
    """8 steps, a checkpoint every 2 (step_2 .. step_8, all kept): copy it, never change it. Trained in
    this process; the subprocess runs of test_kill9 reproduce its losses bit for bit."""
    out = tmp_path_factory.mktemp("base") / "run"
    ok(yx_here("train", *FAST, "--max_steps", "8", "--checkpoint_freq", "2", "--keep_last", "10", "--output_dir", out))
    return out


@pytest.fixture
def run_copy(base_run, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(base_run, dst)
    return dst
