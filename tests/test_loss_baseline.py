"""The default run against its committed loss baseline (tests/assets/loss_baseline.json), and README's
numbers against the same file. Re-record with `python scripts/loss_baseline.py --write`.

Tolerance: what separates a real change from float noise. Noise: the same 20 steps on another CPU's
kernels (ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 on an AVX-512 machine) or another thread
count; a real change: max_lr +1 %, another seed, a reordered reduction in the model. Both measured
sizes are in the baseline file's "tolerance" block; RTOL sits between them with a margin either side.
"""

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASELINE = json.loads((ROOT / "tests" / "assets" / "loss_baseline.json").read_text())


def _script():
    spec = importlib.util.spec_from_file_location("loss_baseline", ROOT / "scripts" / "loss_baseline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_default_runs_first_steps_match_the_committed_baseline(tmp_path):
    base = BASELINE["first_steps"]
    now = _script().first_steps(base["steps"], str(tmp_path / "run"))
    rtol = BASELINE["tolerance"]["rtol"]
    assert now["losses"] == pytest.approx(base["losses"], rel=rtol), (now["losses"], base["losses"])
    assert now["val_loss"] == pytest.approx(base["val_loss"], rel=rtol)
    assert now["losses"][-1] < now["losses"][0] - 0.5  # and the baseline itself is a learning run


def test_readme_quotes_the_baseline_and_names_its_dependency_set():
    readme = (ROOT / "README.md").read_text()
    run = BASELINE["default_run"]
    for step in ("1", "300"):
        assert f"{run['loss'][step]:.6f}" in readme, step
    ppl = " / ".join(f"{run['val_ppl'][s]:.2f}" for s in ("100", "200", "300"))
    assert ppl in readme
    deps = BASELINE["dependency_set"]
    assert re.search(rf"transformers {re.escape(deps['transformers'])}\b", readme)
    assert re.search(rf"torch {re.escape(deps['torch'].split('+')[0])}\b", readme)
    pinned = (ROOT / "constraints.txt").read_text()
    for name in ("torch", "transformers", "tokenizers", "datasets", "accelerate", "numpy"):
        assert f"{name}=={deps[name].split('+')[0]}\n" in pinned, name  # the baseline's set is the pinned one
