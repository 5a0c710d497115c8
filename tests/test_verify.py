import json
import subprocess
import sys

import pytest
import torch

from yxanul import _te


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour")
def test_verify_on_cpu():
    r = subprocess.run([sys.executable, "-m", "yxanul", "verify"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "no CUDA device" in r.stdout and "fp8 recipe delayed" in r.stdout
    assert "precision report for --model medium" in r.stdout and "FP8 requested but off: " in r.stdout
    r = subprocess.run([sys.executable, "-m", "yxanul", "verify", "--require_fp8", "--json"], capture_output=True, text=True)
    assert r.returncode == 1
    out = json.loads(r.stdout)
    rows = out["checks"]
    mlp = out["precision_report"]["layers"]["mlp"]
    assert mlp["fp8"] == 0 and mlp["bf16"] == 24 and mlp["why"] == out["precision_report"]["fallback_reason"]
    assert {row["check"] for row in rows if row["status"] == "FAIL"} >= {"gpu", "fp8 recipe delayed"}
    te_row = next(row for row in rows if row["check"] == "transformer_engine")
    assert te_row["status"] == ("PASS" if _te.TE_AVAILABLE else "FAIL")
