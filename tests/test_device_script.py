"""scripts/device/gpu_checks.sh's `tests` stage, rehearsed on this CPU (every GPU test skips here): a typo or a
wrong selection would otherwise first show on the GPU machine, whose minutes are few."""

import os
import re
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from yxanul.config import parse_args
from yxanul.models.presets import PRESETS
from yxanul.tools.bench_table import VARIANTS

ROOT = Path(__file__).resolve().parents[1]
GRAPHED = "tests/models/test_cuda_graphs.py::test_graphed_blocks_train_like_eager_ones[bf16-none]"  # a node id
FIRST = f"tests/integrations/test_trainer_gpu.py {GRAPHED}"


def names(junit: Path) -> set[str]:
    return {f"{c.get('classname')}::{c.get('name')}" for c in ET.parse(junit).getroot().iter("testcase")}


def test_the_tests_stage_runs_tests_first_then_the_rest_without_them(tmp_path):
    """TESTS_FIRST runs first with its slow tests (the Trainer's ZeRO-1 proofs), the rest leaves them out;
    TESTS_ARGS reaches the rest; both junit files come back for `bench_table commit` to merge."""
    drop = "tests/models/test_qkv_rope_gpu.py"
    bin_dir = tmp_path / "bin"  # the script runs `python3`: this interpreter, whatever python3 is on PATH here
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # not a link: a venv stays one
    (bin_dir / "python3").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", OUT=str(tmp_path / "out"),
               GPU_CHECKS_WORK=str(tmp_path / "work"), GPU_CHECKS_REAP="0",
               TESTS_FIRST=FIRST, TESTS_ARGS=f"--deselect {drop}", HF_HUB_OFFLINE="1")
    r = subprocess.run(["bash", "scripts/device/gpu_checks.sh", "tests"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    log = r.stdout + r.stderr
    assert "=== first-gpu-tests: exit 0" in log and "=== gpu-tests: exit 0" in log, log[-3000:]
    first, rest = names(tmp_path / "out" / "first-tests.xml"), names(tmp_path / "out" / "gpu-tests.xml")
    trainer = {n for n in first if n.startswith("tests.integrations.test_trainer_gpu::")}
    graphed = "tests.models.test_cuda_graphs::" + GRAPHED.split("::")[1]
    assert first == trainer | {graphed} and any("deepspeed_zero1" in n for n in first), first  # slow ones too
    assert rest and not rest & first, rest & first
    assert not any(n.startswith("tests.models.test_qkv_rope_gpu::") for n in rest)
    assert any(n.startswith("tests.models.") for n in rest)


def _next_lease_commands() -> list[str]:
    """The commands of scripts/device/README.md's "The next lease" table (its `command` column)."""
    text = (ROOT / "scripts/device/README.md").read_text()
    section = text[text.index("**The next lease**"):]
    section = section[:section.index("\n### ")]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| ") and "`" in line]
    return [row[1].split("`")[1] for row in rows if len(row) > 2 and "`" in row[1]]


def test_the_next_lease_names_only_tests_variants_presets_and_flags_that_exist():
    """The lease's calls are made back to back with no time to spare: a test id, bench variant, preset or flag
    that no longer exists would first show on the device. Every name the planned commands pass is checked here."""
    commands = _next_lease_commands()
    assert len(commands) >= 3 and any("gpu_checks.sh" in c for c in commands), commands
    seen = set()
    for command in commands:
        env = dict(re.findall(r'([A-Z_]+)=("[^"]*"|\S+)', command))
        env = {k: shlex.split(v)[0] if v.startswith('"') else v for k, v in env.items()}
        seen |= set(env)
        for node in env.get("TESTS_FIRST", "").split():
            path, _, func = node.partition("::")
            assert (ROOT / path).is_file(), node
            defined = rf"^def {re.escape(func.split('[')[0])}\("
            assert not func or re.search(defined, (ROOT / path).read_text(), re.M), node
        for name in filter(None, env.get("FIRST_VARIANTS", "").split(",")):
            assert name in VARIANTS, name
        for name in filter(None, (env.get("FIRST_PRESETS", "") + "," + env.get("PARITY_MODEL", "")).split(",")):
            assert name in PRESETS, name
        if "PARITY_FLAGS" in env:  # the parity trains BF16 and FP8 with these: both must parse
            for precision in ([], ["--use_fp8"]):
                parse_args(["--backend", "te", *shlex.split(env["PARITY_FLAGS"]), *precision])
    assert {"TESTS_FIRST", "FIRST_VARIANTS", "PARITY_FLAGS"} <= seen, seen
