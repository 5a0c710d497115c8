"""scripts/device/gpu_checks.sh's `tests` stage, rehearsed on this CPU (every GPU test skips here): a typo or a
wrong selection would otherwise first show on the GPU machine, whose minutes are few."""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

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
